ONLY="tests" BUDGET_S=120 OUT=$OUT bash scripts/gpu/run.sh > $OUT/tests.txt 2>&1
X=$(mktemp -d); tar -C $X -xJf gpu-bundle/bundle.tar.xz; mkdir $X/m; for f in $X/bundle/mnist/*.gz; do gunzip -c $f > $X/m/$(basename $f .gz); done
export PATHKERNEL_PTX=$X/bundle/epk.ptx LD_LIBRARY_PATH=$(dirname $(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcublas.so.13))
sed -e "s|^path = .*|path = \"$X/m\"|" -e 's/^steps = .*/steps = 30/' -e 's/^n_test = .*/n_test = 128/' > $X/l.toml <<T
[data]
kind = "mnist"
path = ""
per_class = 200
n_test = 0
normalize = true
[model]
kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 6, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 16, kernel = 5 } }, "relu", { max_pool2d = 2 }, "flatten", { dense = 120 }, "relu", { dense = 84 }, "relu", { dense = 10 }]
[train]
optimizer = "sgd"
batch_size = 100
lr = 0.3
steps = 0
seed = 0
T
TIMEFORMAT='wall %R s, user %U s, sys %S s'
{ time timeout 150 $X/bundle/pathkernel train -q --config $X/l.toml --out $X/r ; } >> $OUT/split.txt 2>&1
for d in cuda cpu; do echo "== $d" >> $OUT/split.txt; { time timeout 100 $X/bundle/pathkernel kernel -q --run $X/r --kind epk --quadrature auto:1e-12 --layout diag --steps 20:30 --device $d --out $X/k-$d ; } >> $OUT/split.txt 2>&1; done
python3 scripts/gpu/gram_diff.py $X/k-cuda $X/k-cpu >> $OUT/split.txt 2>&1; nproc >> $OUT/split.txt; true
