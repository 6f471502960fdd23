"""The model: the Llama-family decoder and its layers, the registry of architectures, the
safetensors loader, the tokenizer of a model folder, and the ops that pick a Triton kernel or its
torch reference."""
