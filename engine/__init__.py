"""Engine: GGUF files, tokenizer, chat encoding, Mistral 3 model, vision, sessions, CLI."""
