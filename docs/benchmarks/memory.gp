set terminal pngcairo size 1520,750 font ',10'
set output 'memory.png'
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:*]
set grid ytics
set xtics scale 0 font ',9'
set ylabel 'ratio to ddp'
colors = '#4477aa #ee6677 #228833 #ccbb44 #66ccee #aa3377 #bbbbbb'
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555'
set multiplot layout 2,4 title 'peak tensor memory per rank as a ratio to ddp: lower is smaller' margins 0.07,0.98,0.07,0.84 spacing 0.07,0.14
set title 'fp32'
set key at screen 0.5, screen 0.935 center top horizontal font ',9'
plot for [i=2:5] 'memory.dat' index 0 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'bf16'
unset key
plot for [i=2:5] 'memory.dat' index 1 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'fp32 + offload disk'
unset key
plot for [i=2:5] 'memory.dat' index 2 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'bf16 + offload disk'
unset key
plot for [i=2:5] 'memory.dat' index 3 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'fp32 + ac1'
unset key
plot for [i=2:5] 'memory.dat' index 4 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'bf16 + ac1'
unset key
plot for [i=2:5] 'memory.dat' index 5 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'fp32 + ac1 + offload disk'
unset key
plot for [i=2:5] 'memory.dat' index 6 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title 'bf16 + ac1 + offload disk'
unset key
plot for [i=2:5] 'memory.dat' index 7 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
unset multiplot
