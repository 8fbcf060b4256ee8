"""The model library: the hub, the catalogue, downloads, the models folder, and which projector belongs to which model."""
