"""Weight import from torch.nn layers and Hugging Face models (objects in memory, never downloads)."""
