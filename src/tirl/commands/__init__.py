"""What the CLI runs, built from the layers below: each stage top to bottom (`stages`: SFT, RL, eval), the run's
whole configuration (`run_config`), and every `tirl <command>` front end: `stage` (sft, rl, eval), `plan`,
`tokcheck` (check-tokens), `data` with `sample` and `filter`, `models` (model import, export), `sandbox`,
`analyze`, and `args`, what the ones reading the config tree share. The demo's front end is `tirl.demo.command`."""
