"""Pure tensor functions (no ``nn.Module``): tree indexing, HSA, and other attention ops."""
