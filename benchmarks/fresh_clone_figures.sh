#!/usr/bin/env bash
# The figures issue 30's "Done when" asks for, measured as a new user meets them, on this machine:
#
#   benchmarks/fresh_clone_figures.sh [OUT]    # default OUT: /tmp/fresh-clone-figures; ~25 min on 2 AVX-512 cores
#   benchmarks/fresh_clone_figures.sh OUT test # only make test (or: run, only make run)
#
# 1. the CPU kind (.ci/run's first line);
# 2. make test as CI runs it: `CI=true bash .ci/run` in a fresh clone of HEAD with ../shared beside it, pip's cache
#    off: wall time, set-up (the wall time minus the three pytest processes'), each pytest process's time and result,
#    CPU time, largest RSS;
# 3. `make run` in a second fresh clone, pip's cache off and an empty evalkit cache (its variants made anew):
#    install (to the venv's stamp), evaluation (the stamp to report.html), first report.
# Every figure is wall time: run it on an otherwise idle machine (the load average is printed before each step).
# Each step starts with SIGINT at its default (tests/with_default_signals.py), even where this runs in the background.
# The clones are of HEAD: commit first. Logs, clones and figures.txt stay under OUT.
set -uo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
shared=$(cd "$repo/.." && pwd)/shared
out=${1:-/tmp/fresh-clone-figures}
only=${2:-}
[ -d "$shared" ] || { echo "fresh_clone_figures: no $shared (CI clones main with ../shared beside it)" >&2; exit 2; }
[ -e "$out" ] && { echo "fresh_clone_figures: $out exists; give another OUT or remove it" >&2; exit 2; }
mkdir -p "$out"
figures=$out/figures.txt
note() { echo "$*" | tee -a "$figures"; }
mtime() { stat -c %Y "$1" 2>/dev/null; }
clone() {  # clone DIR: a fresh clone of HEAD with ../shared beside it
  git clone -q "$repo" "$1/main" && ln -s "$shared" "$1/shared"
}
timed() {  # timed NAME CMD...: run CMD under /usr/bin/time in the current directory, log to OUT/NAME.log
  local name=$1; shift
  note "$name: load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 "$repo/tests/with_default_signals.py" /usr/bin/time -v -o "$out/$name.time" "$@" > "$out/$name.log" 2>&1
}
resources() {  # resources NAME: CPU time and largest RSS from /usr/bin/time -v
  local t=$out/$1.time
  awk -F': ' '/User time/{u=$2} /System time/{s=$2} /Maximum resident/{r=$2}
              END{printf "CPU %.0f s (user %.0f, system %.0f), largest RSS %.1f GB", u+s, u, s, r/1048576}' "$t"
}

note "commit: $(git -C "$repo" rev-parse --short HEAD) ($(git -C "$repo" log -1 --format=%cd --date=iso))"
note "$(bash -c "$(sed -n '/^model=/,/^echo /p' "$repo/.ci/run")")"

if [ "$only" != run ]; then
  clone "$out/test"
  start=$(date +%s)
  (cd "$out/test/main" && timed make-test env CI=true PIP_NO_CACHE_DIR=1 bash .ci/run)
  rc=$?
  wall=$(( $(date +%s) - start ))
  # pytest's summary lines, in the Makefile's order: the first process, the other CPU kind's paths, the vLLM process
  mapfile -t halves < <(grep -E '^=* *[0-9]+ (passed|failed|error)' "$out/make-test.log" | sed 's/^=* *//; s/ *=*$//')
  spent=0
  for h in "${halves[@]}"; do
    s=$(sed -n 's/.* in \([0-9.]*\)s.*/\1/p' <<< "$h"); spent=$(awk -v a="$spent" -v b="${s:-0}" 'BEGIN{print a + b}')
  done
  note "make test (CI=true bash .ci/run, fresh clone): exit $rc, wall $((wall / 60)) min $((wall % 60)) s; $(resources make-test)"
  note "  set-up (wall minus the pytest processes): $(awk -v w="$wall" -v s="$spent" 'BEGIN{printf "%.0f s", w - s}')"
  names=("first process" "other CPU kind's paths" "vLLM process")
  for i in "${!halves[@]}"; do note "  ${names[$i]:-pytest $i}: ${halves[$i]}"; done
fi

if [ "$only" != test ]; then
  clone "$out/run"
  start=$(date +%s)
  (cd "$out/run/main" && timed make-run env PIP_NO_CACHE_DIR=1 EVALKIT_CACHE_DIR="$out/run-cache" make run)
  rc=$?
  installed=$(mtime "$out/run/main/.venv/.evalkit-installed")
  report=$(ls -1 "$out"/run/main/reports/*/report.html 2>/dev/null | head -1)
  reported=$(mtime "${report:-/nonexistent}")
  note "make run (fresh clone, no pip cache, empty evalkit cache): exit $rc; $(resources make-run)"
  if [ -n "$installed" ] && [ -n "$reported" ]; then
    note "  install $((installed - start)) s, evaluation $((reported - installed)) s, first report $((reported - start)) s after the start"
  else
    note "  no venv stamp or no report.html: see $out/make-run.log"
  fi
fi
echo "figures: $figures"
