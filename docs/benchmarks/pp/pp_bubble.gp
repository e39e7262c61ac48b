set terminal pngcairo size 1440,530 font ',10'
set output 'pp_bubble.png'
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:0.5]
set grid ytics
set xtics scale 0 font ',8' rotate by -35
set ylabel 'idle share of the step (mean over ranks)'
colors = '#4477aa #ee6677 #228833 #ccbb44 #66ccee #aa3377 #bbbbbb'
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555'
set multiplot layout 1,3 title 'each rank''s idle share of a pipeline step (pp 2), measured, simulated with the run''s costs, and by the formula' margins 0.07,0.98,0.2,0.76 spacing 0.07,0.14
set title '2 micro-batches'
set key at screen 0.5, screen 0.935 center top horizontal maxrows 1 font ',9'
plot for [i=2:4] 'pp_bubble.dat' index 0 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title '4 micro-batches'
unset key
plot for [i=2:4] 'pp_bubble.dat' index 1 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
set title '8 micro-batches'
unset key
plot for [i=2:4] 'pp_bubble.dat' index 2 using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)
unset multiplot
