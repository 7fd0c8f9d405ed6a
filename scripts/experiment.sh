# Used by the experiment driver the experiment files cannot express yet (multi_turn.sh),
# sourced after they set `out` (where runs and evaluations go), `quiet` and `config`, and define
# `set_args SET` (prints the eval arguments that choose the set's puzzles, K and anything else the
# experiment evaluates with; a later --max-tokens overrides the 192 below); `model` (default
# smollm2-135m) is the model evaluated.

# evaluate NAME ADAPTER SET...: avg@K on each set into $out/eval-NAME-SET.json (kept when it
# exists), paired with the base model's evaluation of the same set. A variant sets `tag` (its
# file is eval-NAME-SET-TAG.json, not paired) and `with` (its extra eval arguments), e.g.
#   tag=generic with="--feedback generic" evaluate base none train
evaluate() {
  local name=$1 adapter=$2; shift 2
  local set file args extra more
  for set in "$@"; do
    file=$out/eval-$name-$set${tag:+-$tag}.json
    [ -f "$file" ] && continue
    read -r -a extra <<< "$(set_args "$set")"
    read -r -a more <<< "${with:-}"
    args=(--model "${model:-smollm2-135m}" --max-tokens 192 --batch-size 64 --seed 0 --out "$file" "${extra[@]}" "${more[@]}")
    [ "$adapter" = none ] || args+=(--adapter "$adapter")
    [ "$name" = base ] || [ -n "${tag:-}" ] || args+=(--baseline "$out/eval-base-$set.json")
    mlx-swe-rl eval "${args[@]}"
  done
}

# train RUN KEY=VALUE...: a run of $config under $out/RUN, resumed if it was started
# (another config for one run: config=FILE train RUN ...).
train() {
  local run=$1; shift
  local sets=(--set output_dir="$out" --set run_name="$run") kv resume=
  for kv in "$@"; do sets+=(--set "$kv"); done
  [ -f "$out/$run/config.yaml" ] && resume=--resume
  mlx-swe-rl train --config "$config" "${sets[@]}" $resume $quiet
}
