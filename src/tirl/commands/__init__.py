"""What the CLI runs, built from the layers below: each stage top to bottom (`stages`: SFT, RL, eval), the run's
whole configuration (`run_config`), `tirl plan` (`plan`) and `tirl check-tokens` (`tokcheck`). The demo's
commands live in `tirl.demo.tiny`."""
