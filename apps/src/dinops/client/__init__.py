"""The web client (`dinops client`): upload an image, see DINO's boxes. No torch, no uploads on disk."""
