set terminal pngcairo size 1400,700 font ',10'
set output 'memory.png'
set title 'tensor memory per rank at its peak, by category (MiB)'
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.8
set ylabel 'MiB'
set yrange [0:*]
set grid ytics
set key outside right top
set xtics rotate by -40 scale 0 font ',8'
set bmargin 14
plot 'memory.dat' using 2:xtic(1) title 'params' lc rgb '#4477aa', '' using 3 title 'grads' lc rgb '#ee6677', '' using 4 title 'optimizer' lc rgb '#228833', '' using 5 title 'activations+other' lc rgb '#ccbb44'
