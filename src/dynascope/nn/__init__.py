"""Building blocks: attention, Transformer, MLP, and capture points for model internals."""

from .attention import MultiHeadAttention as MultiHeadAttention
from .capture import CapturePoint as CapturePoint
from .capture import capture as capture
from .capture import capture_patterns as capture_patterns
from .transformer import MLP as MLP
from .transformer import Transformer as Transformer
from .transformer import TransformerBlock as TransformerBlock
from .vit import ViT as ViT

__all__ = [
    "MLP",
    "CapturePoint",
    "MultiHeadAttention",
    "Transformer",
    "TransformerBlock",
    "ViT",
    "capture",
    "capture_patterns",
]
