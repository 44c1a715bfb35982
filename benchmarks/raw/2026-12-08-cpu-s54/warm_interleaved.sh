# interleaved fresh-process warm builds of two trees, each with its own (warm) cache: before = dcc3167, after = HEAD
M=$1; N=$2; CB=$3; CA=$4
for i in $(seq $N); do
  PYTHONPATH=/tmp/s54/wt XDG_CACHE_HOME=$CB .venv/bin/python /tmp/s54/warm_fresh.py --one $M fp16 | sed "s/^/before /"
  PYTHONPATH=/work/main XDG_CACHE_HOME=$CA .venv/bin/python /tmp/s54/warm_fresh.py --one $M fp16 | sed "s/^/after  /"
done
