# Shared by the bench scripts (sourced, from the repository root).

# faer's DGEMM rate in GFLOP/s on a 2048² product: gemm_rate BIN RUN (the bench opens a trained
# run only to have one).
gemm_rate() {
    "$1" bench --run "$2" --dgemm 2048 --repeat 3 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gflops"])'
}
