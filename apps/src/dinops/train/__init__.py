"""Training and evaluation of DINO: `dinops train`, `dinops eval`, `dinops analyze`."""
