"""`DINOConfig`: the detector's configuration, with the official DINO argument names.

The official training script stores its resolved ``args`` in every checkpoint; :meth:`DINOConfig.from_official`
reads such a dict (or the config JSON files beside the reference data) and ignores every key the detector does not
use, including ``_``-prefixed metadata. Only the ``build_*`` functions read a config; the modules themselves take
typed keyword arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")


@dataclass
class DINOConfig:
    """All options of DINO-4scale R50, defaults as in the official ``config/DINO/DINO_4scale.py``."""

    # backbone
    backbone: str = "resnet50"
    dilation: bool = False
    return_interm_indices: list[int] = field(default_factory=lambda: [1, 2, 3])
    lr_backbone: float = 1e-5  # > 0 means layer2-4 of the backbone train (the official rule)
    backbone_weights: str | None = None  # ours: local torchvision-format ImageNet weights; never downloaded
    position_embedding: str = "sine"
    pe_temperatureH: int = 20  # noqa: N815 (official name)
    pe_temperatureW: int = 20  # noqa: N815 (official name)
    # transformer
    hidden_dim: int = 256
    nheads: int = 8
    num_queries: int = 900
    num_feature_levels: int = 4
    enc_layers: int = 6
    dec_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.0
    transformer_activation: str = "relu"
    enc_n_points: int = 4
    dec_n_points: int = 4
    query_dim: int = 4
    pre_norm: bool = False
    num_patterns: int = 0
    two_stage_type: str = "standard"
    two_stage_add_query_num: int = 0
    two_stage_pat_embed: int = 0
    two_stage_learn_wh: bool = False
    two_stage_keep_all_tokens: bool = False
    two_stage_bbox_embed_share: bool = False
    two_stage_class_embed_share: bool = False
    embed_init_tgt: bool = True
    dec_pred_bbox_embed_share: bool = True
    dec_pred_class_embed_share: bool = True
    decoder_sa_type: str = "sa"
    decoder_module_seq: list[str] = field(default_factory=lambda: ["sa", "ca", "ffn"])
    dec_layer_number: list[int] | None = None
    use_deformable_box_attn: bool = False
    random_refpoints_xy: bool = False
    fix_refpoints_hw: int = -1
    use_detached_boxes_dec_out: bool = False
    decoder_layer_noise: bool = False
    masks: bool = False
    aux_loss: bool = True
    # classes and denoising
    num_classes: int = 91
    use_dn: bool = True
    dn_number: int = 100
    dn_box_noise_scale: float = 0.4
    dn_label_noise_ratio: float = 0.5
    dn_labelbook_size: int = 91
    # matcher and losses
    matcher_type: str = "HungarianMatcher"
    set_cost_class: float = 2.0
    set_cost_bbox: float = 5.0
    set_cost_giou: float = 2.0
    focal_alpha: float = 0.25
    cls_loss_coef: float = 1.0
    bbox_loss_coef: float = 5.0
    giou_loss_coef: float = 2.0
    interm_loss_coef: float = 1.0
    no_interm_box_loss: bool = False
    # post-processing
    num_select: int = 300
    nms_iou_threshold: float = -1

    @classmethod
    def from_official(cls, args: Mapping[str, Any] | Any) -> DINOConfig:
        """Build from an official ``args`` dict or ``argparse.Namespace``; unknown and ``_`` keys are ignored."""
        if not isinstance(args, Mapping):
            args = vars(args)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in args.items() if not k.startswith("_") and k in known}
        for key in ("return_interm_indices", "decoder_module_seq"):
            if key in values and values[key] is not None:
                values[key] = list(values[key])
        return cls(**values)

    @classmethod
    def dino_4scale_r50(cls) -> DINOConfig:
        """The official DINO-4scale R50 (checkpoint0011_4scale.pth, checkpoint0033_4scale.pth)."""
        return cls()

    @classmethod
    def dino_5scale_r50(cls) -> DINOConfig:
        """The official DINO-5scale R50: layer1..4 plus one extra level."""
        return cls(num_feature_levels=5, return_interm_indices=[0, 1, 2, 3])

    def replace(self, **changes: Any) -> DINOConfig:
        """A copy with some fields changed (unknown names are an error)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, official names; what our own checkpoints store as ``args``."""
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise ValueError naming the option when a value is outside what this implementation supports."""
        unsupported = {
            "position_embedding": ("sine",),
            "two_stage_type": ("standard", "no"),
            "decoder_sa_type": ("sa",),
            "transformer_activation": ("relu", "gelu"),
            "matcher_type": ("HungarianMatcher",),
        }
        for name, allowed in unsupported.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"DINOConfig.{name}={getattr(self, name)!r} is not supported (use one of {allowed})")
        if self.backbone not in _RESNETS:
            raise ValueError(f"DINOConfig.backbone={self.backbone!r} is not supported (use one of {_RESNETS})")
        must_be_default = {
            "pre_norm": False,
            "num_patterns": 0,
            "two_stage_add_query_num": 0,
            "two_stage_pat_embed": 0,
            "two_stage_learn_wh": False,
            "two_stage_keep_all_tokens": False,
            "dec_layer_number": None,
            "use_deformable_box_attn": False,
            "random_refpoints_xy": False,
            "fix_refpoints_hw": -1,
            "use_detached_boxes_dec_out": False,
            "decoder_layer_noise": False,
            "masks": False,
            "query_dim": 4,
        }
        for name, default in must_be_default.items():
            if getattr(self, name) != default:
                raise ValueError(f"DINOConfig.{name}={getattr(self, name)!r} is not supported (only {default!r})")
        if list(self.decoder_module_seq) != ["sa", "ca", "ffn"]:
            raise ValueError(f"DINOConfig.decoder_module_seq={self.decoder_module_seq!r} is not supported")
        indices = list(self.return_interm_indices)
        if not indices or indices != sorted(set(indices)) or not all(0 <= i <= 3 for i in indices):
            raise ValueError(f"DINOConfig.return_interm_indices={indices!r}: need distinct ascending values in 0..3")
        if self.num_feature_levels < max(1, len(indices)):
            raise ValueError(
                f"DINOConfig.num_feature_levels={self.num_feature_levels} must be >= "
                f"len(return_interm_indices)={len(indices)}"
            )
        if self.hidden_dim % 32 or self.hidden_dim % self.nheads:
            raise ValueError(
                f"DINOConfig.hidden_dim={self.hidden_dim} must be a multiple of 32 (GroupNorm) "
                f"and of nheads={self.nheads}"
            )
        if self.dilation and self.backbone in ("resnet18", "resnet34"):
            raise ValueError(f"DINOConfig.dilation=True needs a bottleneck ResNet, not {self.backbone!r}")
        if (self.two_stage_bbox_embed_share or self.two_stage_class_embed_share) and not (
            self.dec_pred_bbox_embed_share and self.dec_pred_class_embed_share
        ):
            raise ValueError("two_stage_*_embed_share needs dec_pred_bbox_embed_share and dec_pred_class_embed_share")
        if self.num_classes < 1 or self.num_queries < 1 or self.dec_layers < 1 or self.enc_layers < 0:
            raise ValueError("num_classes, num_queries and dec_layers must be >= 1 and enc_layers >= 0")
        if self.use_dn and self.dn_number > 0 and self.num_classes > self.dn_labelbook_size + 1:
            raise ValueError(
                f"dn_labelbook_size={self.dn_labelbook_size} must be >= num_classes - 1 = {self.num_classes - 1} "
                "(label_enc embeds the ground-truth labels)"
            )
