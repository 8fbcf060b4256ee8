"""Mistral 3 maths and formats: configs from GGUF metadata, the text decoder, the Pixtral vision tower, image preprocessing, the tekken tokenizer, the v7 chat encoding."""
