"""Studies: a benchmark each for one question, with its answer saved in bench/results/."""
