"""The model library: the hub, the catalogue, downloads, the models folder, which projector belongs to which model, and whether a model fits this machine."""
