set terminal pngcairo size 1400,700 font ',10'
set output 'tokens_per_s.png'
set title 'tokens/s per case (all ranks; bar: median, whiskers: min-max over repeats)'
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.7 border -1
set boxwidth 0.8
set ylabel 'tokens/s'
set yrange [0:*]
set grid ytics
set key off
set xtics rotate by -40 scale 0 font ',8'
set bmargin 14
plot 'tokens_per_s.dat' using 2:3:4:xtic(1) lc rgb '#4477aa'
