#!/usr/bin/env bash
# The GPU test kit in one call, on a bare GPU machine without network (issue 15):
#
#     bash tests/gpu/on_device.sh OUTDIR
#
# 1. refuses at once without a CUDA GPU: the one-line reason on stderr and in OUTDIR/summary.md, exit 1;
# 2. installs the wheels of .gpu-wheels/ (made by `make gpu-wheels`) that this python lacks, with
#    --no-index --no-deps --target, and puts the checkout and that folder on PYTHONPATH;
# 3. runs tests/gpu/ with a per-test timeout (junit.xml and pytest.log in OUTDIR);
# 4. runs the GPU benchmarks (bench.log): bench/gpu_launch.py (launch cost, N = 1, NCCL, against torchrun
#    and Accelerate's notebook_launcher), bench/gpu_steady.py (steady DDP steps/s against torchrun, paired,
#    NCCL), bench/gpu_steady.py --ranks-per-gpu 2 (two ranks sharing each card through gloo), and
#    bench/live_recovery.py --backend nccl --quick (recovery in place against a restart; two GPUs and up),
#    bench/gpu_ranks.py --quick (issue 34: a CUDA result's and a push's way through shared memory, live cells
#    and one-shot launches at 2, 4 and 8 ranks; runs only in what is left of the total budget);
# 5. writes OUTDIR/summary.md: pass/fail per test, versions, nvidia-smi, the bench tables.
# Sized for about 7 minutes on one H200. Each stage has a hard cap, and the whole run a deadline
# (TOTAL_BUDGET_S): a benchmark gets at most what is left of it and is skipped under 20 s, so the run
# ends within 8 minutes, leaving a 15-minute device budget room for one rerun.
# Environment: PY (python3), GPU_WHEELS (.gpu-wheels), GPU_TEST_TIMEOUT (120 s per test),
# TOTAL_BUDGET_S (465), TESTS_BUDGET_S (270: no test starts after 210 s, so pytest ends and writes junit.xml),
# LAUNCH_BENCH_BUDGET_S (40), STEADY_BENCH_BUDGET_S (95), SHARED_BENCH_BUDGET_S (45),
# RECOVERY_BENCH_BUDGET_S (60; seconds on one GPU, which it says cannot hold two NCCL ranks),
# RANKS_BENCH_BUDGET_S (120), SKIP_BENCH=1.
set -u -o pipefail
OUT=${1:?usage: bash tests/gpu/on_device.sh OUTDIR}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO" || exit 2
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
PY=${PY:-python3}
START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nblaunch-gpu-kit.XXXXXX")
STAGES="$WORK/stages.tsv"
export PYTHONUNBUFFERED=1
SECONDS=0

stage() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$STAGES"; }   # name, status, detail
summary() {
    "$PY" tests/gpu/write_summary.py "$OUT" "$STAGES" "$WORK" "$START" \
        || { echo "# nblaunch GPU test kit"; cat "$STAGES"; } >"$OUT/summary.md"
}
capped() {  # capped SECONDS LOG CMD...: run CMD with a hard time cap; its exit status, 124 past the cap
    local cap=$1 log=$2
    shift 2
    timeout -k 10 "$cap" "$@" >>"$log" 2>&1
}

# 1. a CUDA GPU, as the python that runs the tests sees it
if ! "$PY" tests/gpu/require_cuda.py 2>"$WORK/cuda.err"; then
    cat "$WORK/cuda.err" >&2
    stage "CUDA check" refused "$(head -n 1 "$WORK/cuda.err")"
    summary
    rm -rf "$WORK"
    exit 1
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader >"$WORK/nvidia-smi.txt" 2>&1
stage "CUDA check" ok "$(wc -l <"$WORK/nvidia-smi.txt") GPU(s); ${SECONDS}s"

# 2. the missing Python packages, from wheels carried here
SITE="$WORK/site"
WHEELS=${GPU_WHEELS:-.gpu-wheels}
if [ -d "$WHEELS" ]; then
    mapfile -t MISSING < <("$PY" tests/gpu/missing_wheels.py "$WHEELS")
    if [ "${#MISSING[@]}" -eq 0 ]; then
        stage install ok "nothing missing from $WHEELS"
    elif "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$SITE" "${MISSING[@]}" >"$WORK/pip.log" 2>&1; then
        stage install ok "${#MISSING[@]} wheels into $SITE: $(for w in "${MISSING[@]}"; do basename "$w" | cut -d- -f1; done | tr '\n' ' ')(${SECONDS}s)"
    else
        stage install FAILED "$(tail -n 3 "$WORK/pip.log")"
    fi
else
    stage install skipped "no $WHEELS folder: IPython/Jupyter tests need it (make gpu-wheels, then carry it)"
fi
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
if "$PY" -c "import IPython, ipykernel, ipywidgets, jupyter_client, jupyter_server, nbclient, nbformat, pynvml" \
    2>"$WORK/import.err"; then
    stage imports ok "IPython, ipykernel, ipywidgets, jupyter_client, jupyter_server, nbclient, nbformat, pynvml import"
else
    stage imports FAILED "$(tail -n 1 "$WORK/import.err")"
fi

# 3. the GPU tests
t0=$SECONDS
# only pytest-timeout among the machine's pytest plugins: none of the others can touch CUDA in the test process
export GPU_TESTS_BUDGET_S=$((${TESTS_BUDGET_S:-270} - 60))  # tests/gpu/conftest.py skips what would start later
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 capped "${TESTS_BUDGET_S:-270}" "$OUT/pytest.log" "$PY" -m pytest tests/gpu \
    -p pytest_timeout -p no:cacheprovider -rA --timeout="${GPU_TEST_TIMEOUT:-120}" --junitxml="$OUT/junit.xml"
rc=$?
case $rc in
    0) stage "tests/gpu" passed "$((SECONDS - t0))s" ;;
    124 | 137) stage "tests/gpu" "TIMED OUT" "stopped after ${TESTS_BUDGET_S:-270}s; see pytest.log" ;;
    *) stage "tests/gpu" FAILED "pytest exit status $rc after $((SECONDS - t0))s" ;;
esac
status=$rc

# 4. the GPU benchmarks: name|cap (s)|arguments; each is told to start no round past its cap less 12 s
TOTAL=${TOTAL_BUDGET_S:-465}
BENCHES="gpu_launch|${LAUNCH_BENCH_BUDGET_S:-40}|--runs 3
gpu_steady|${STEADY_BENCH_BUDGET_S:-95}|--pairs 4 --steps 60
gpu_steady shared|${SHARED_BENCH_BUDGET_S:-45}|--ranks-per-gpu 2 --pairs 2 --steps 10 --warmup 3
live_recovery nccl|${RECOVERY_BENCH_BUDGET_S:-60}|--backend nccl --quick
gpu_ranks|${RANKS_BENCH_BUDGET_S:-120}|--quick"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    while IFS='|' read -r name cap args; do
        left=$((TOTAL - SECONDS))
        [ "$cap" -le "$left" ] || cap=$left
        if [ "$cap" -lt 20 ]; then
            stage "bench.$name" skipped "only ${left}s left of the ${TOTAL}s run"
            continue
        fi
        t0=$SECONDS
        echo "=== bench.$name $args ===" >>"$OUT/bench.log"
        # shellcheck disable=SC2086  # $args is several words
        capped "$cap" "$OUT/bench.log" "$PY" -m "bench.${name%% *}" $args --budget-s $((cap - 12))
        rc=$?
        case $rc in
            0) stage "bench.$name" ok "$((SECONDS - t0))s" ;;
            124 | 137) stage "bench.$name" "TIMED OUT" "stopped after ${cap}s; see bench.log" ;;
            *) stage "bench.$name" FAILED "exit status $rc; see bench.log" ;;
        esac
        [ $rc -eq 0 ] || [ $status -ne 0 ] || status=$rc
    done <<<"$BENCHES"
fi

stage total done "${SECONDS}s"
summary
rm -rf "$WORK"
exit $status
