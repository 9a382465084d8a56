"""Framework integrations: Hugging Face ``Trainer`` (and ms-swift), PyTorch Lightning."""
