"""`tirl demo`: the whole loop on the arithmetic task with a tiny model built from scratch (`tiny`), over seeds
(`seeds`) or against a pass@k objective (`compare`); SmolLM2-135M-Instruct on the arithmetic or on GSM8K
(`smollm2`), with stitched against sampled SFT data (`compare_data`)."""
