"""`tirl compare`: an ablation as one command. Arms are named override sets on one base config; each seed's SFT
model is trained once and shared by the arms that start from it; every arm trains RL from it, is evaluated, and is
compared with the baseline arm by a paired interval over seeds and problems.

`arms` defines a study (`Arm`, `Study`, the `--arm`/`--arms` syntax); `presets` the named studies; `starts` how a
seed's data and SFT model are made (the tiny demo's or SmolLM2's stages, each reused when made from the same inputs:
`tirl.demo.stages`); `runner` the loop over seeds and arms, each arm's RL and evaluation (a failing arm is recorded,
not fatal); `summary` the numbers (pure: spreads, paired intervals, verdicts); `figures` the PNGs; `report`
report.json and the console.
"""
