"""Datasets for DINO: COCO-format annotations (validated), DINO's augmentation, a synthetic dataset, loaders."""
