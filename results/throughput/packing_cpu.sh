for w in 2 1; do
  rm -rf /tmp/pack_$w; start=$(date +%s.%N)
  python -m suite run --methods vanilla --tasks sst2 --seeds 1,2,3,4 --data-dir ../shared/data/glue --workers $w \
     --set train.max_train_samples=500 --epochs 1 --out /tmp/pack_$w > /tmp/pack_$w.log 2>&1
  end=$(date +%s.%N); echo "workers $w: $(echo "$end - $start" | bc) s, $(ls /tmp/pack_$w/runs/*.json | grep -v predictions | wc -l) records, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
