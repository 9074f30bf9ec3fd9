"""Building blocks: attention, Transformer, MLP, and capture points for model internals."""

from .attention import MultiHeadAttention as MultiHeadAttention
from .autoencoder import LinearAutoencoder as LinearAutoencoder
from .autoencoder import depth_lr as depth_lr
from .capture import CapturePoint as CapturePoint
from .capture import capture as capture
from .capture import capture_patterns as capture_patterns
from .diagonal_attention import DiagonalAttention as DiagonalAttention
from .diagonal_attention import diagonal_attention as diagonal_attention
from .reparam import SigmaReparam as SigmaReparam
from .reparam import convert_to_sigma_reparam as convert_to_sigma_reparam
from .reparam import register_sigma_reparam as register_sigma_reparam
from .reparam import remove_norm_layers as remove_norm_layers
from .reparam import remove_sigma_reparam as remove_sigma_reparam
from .reparam import sigma_reparam_modules as sigma_reparam_modules
from .transformer import MLP as MLP
from .transformer import Transformer as Transformer
from .transformer import TransformerBlock as TransformerBlock
from .vit import ViT as ViT

__all__ = [
    "MLP",
    "CapturePoint",
    "DiagonalAttention",
    "LinearAutoencoder",
    "MultiHeadAttention",
    "SigmaReparam",
    "Transformer",
    "TransformerBlock",
    "ViT",
    "capture",
    "capture_patterns",
    "convert_to_sigma_reparam",
    "depth_lr",
    "diagonal_attention",
    "register_sigma_reparam",
    "remove_norm_layers",
    "remove_sigma_reparam",
    "sigma_reparam_modules",
]
