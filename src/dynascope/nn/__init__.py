"""Building blocks: attention, Transformer, MLP, and capture points for model internals."""

from .attention import MultiHeadAttention as MultiHeadAttention
from .attention import masked_softmax as masked_softmax
from .autoencoder import LinearAutoencoder as LinearAutoencoder
from .autoencoder import depth_lr as depth_lr
from .capture import CapturePoint as CapturePoint
from .capture import capture as capture
from .capture import capture_patterns as capture_patterns
from .cnn import SimpleCNN as SimpleCNN
from .diagonal_attention import DiagonalAttention as DiagonalAttention
from .diagonal_attention import diagonal_attention as diagonal_attention
from .hyla import RelativePositionBias as RelativePositionBias
from .hypernet_transformer import HypernetTransformer as HypernetTransformer
from .hypernet_transformer import SequenceTransformer as SequenceTransformer
from .inner_loop import fit_codes as fit_codes
from .meta_learners import MetaLearner as MetaLearner
from .mlp import MLP as ParametrizedMLP
from .multitask_hypernet import MonolithicMLP as MonolithicMLP
from .multitask_hypernet import MultitaskHypernet as MultitaskHypernet
from .parametrization import apply_mup_attention as apply_mup_attention
from .parametrization import apply_mup_readout as apply_mup_readout
from .parametrization import infer_shapes as infer_shapes
from .parametrization import mup_parameter_groups as mup_parameter_groups
from .permutation_nets import KaimingMLP as KaimingMLP
from .random_inputs import RandomInputs as RandomInputs
from .random_inputs import append_seeds as append_seeds
from .random_inputs import draw_seeds as draw_seeds
from .recurrent import LRU as LRU
from .recurrent import GatedLinearRNN as GatedLinearRNN
from .recurrent import LRUBlock as LRUBlock
from .recurrent import LRUNetwork as LRUNetwork
from .recurrent import RNNBaseline as RNNBaseline
from .recurrent import causal_linear_attention as causal_linear_attention
from .recurrent import construction_counts as construction_counts
from .recurrent import gated_rnn_from_linear_attention as gated_rnn_from_linear_attention
from .reparam import SigmaReparam as SigmaReparam
from .reparam import convert_to_sigma_reparam as convert_to_sigma_reparam
from .reparam import register_sigma_reparam as register_sigma_reparam
from .reparam import remove_norm_layers as remove_norm_layers
from .reparam import remove_sigma_reparam as remove_sigma_reparam
from .reparam import sigma_reparam_modules as sigma_reparam_modules
from .transformer import MLP as MLP
from .transformer import Transformer as Transformer
from .transformer import TransformerBlock as TransformerBlock
from .universal import HyperUT as HyperUT
from .universal import UniversalTransformer as UniversalTransformer
from .universal import adaptive_computation_time as adaptive_computation_time
from .vit import ViT as ViT

__all__ = [
    "MLP",
    "CapturePoint",
    "DiagonalAttention",
    "HyperUT",
    "GatedLinearRNN",
    "HypernetTransformer",
    "KaimingMLP",
    "LRU",
    "LRUBlock",
    "LRUNetwork",
    "LinearAutoencoder",
    "MetaLearner",
    "MonolithicMLP",
    "MultitaskHypernet",
    "MultiHeadAttention",
    "ParametrizedMLP",
    "RNNBaseline",
    "RandomInputs",
    "RelativePositionBias",
    "SequenceTransformer",
    "SigmaReparam",
    "SimpleCNN",
    "Transformer",
    "TransformerBlock",
    "UniversalTransformer",
    "ViT",
    "apply_mup_attention",
    "append_seeds",
    "adaptive_computation_time",
    "apply_mup_readout",
    "capture",
    "capture_patterns",
    "causal_linear_attention",
    "construction_counts",
    "convert_to_sigma_reparam",
    "depth_lr",
    "diagonal_attention",
    "draw_seeds",
    "fit_codes",
    "gated_rnn_from_linear_attention",
    "infer_shapes",
    "masked_softmax",
    "mup_parameter_groups",
    "register_sigma_reparam",
    "remove_norm_layers",
    "remove_sigma_reparam",
    "sigma_reparam_modules",
]
