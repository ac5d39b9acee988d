"""Factories: the only place that reads a :class:`DINOConfig`."""

from __future__ import annotations

from dinops.model.backbone import Backbone, BackboneWithPosition
from dinops.model.config import DINOConfig
from dinops.model.criterion import SetCriterion, official_weight_dict
from dinops.model.detector import DINO
from dinops.model.matcher import HungarianMatcher
from dinops.model.position_encoding import PositionEmbeddingSineHW


def build_backbone(cfg: DINOConfig) -> BackboneWithPosition:
    """ResNet + sine position encoding (hidden_dim // 2 features per coordinate; 128 for the official 256)."""
    backbone = Backbone(
        name=cfg.backbone,
        dilation=cfg.dilation,
        return_interm_indices=list(cfg.return_interm_indices),
        train_backbone=cfg.lr_backbone > 0,
        weights_path=cfg.backbone_weights,
    )
    position = PositionEmbeddingSineHW(
        num_pos_feats=cfg.hidden_dim // 2, temperature_h=cfg.pe_temperatureH, temperature_w=cfg.pe_temperatureW
    )
    return BackboneWithPosition(backbone, position)


def build_dino(cfg: DINOConfig) -> DINO:
    """The detector for ``cfg``; its state_dict has the official keys, shapes and dtypes."""
    cfg.validate()
    return DINO(
        backbone=build_backbone(cfg),
        num_classes=cfg.num_classes,
        num_queries=cfg.num_queries,
        hidden_dim=cfg.hidden_dim,
        nheads=cfg.nheads,
        num_feature_levels=cfg.num_feature_levels,
        enc_layers=cfg.enc_layers,
        dec_layers=cfg.dec_layers,
        dim_feedforward=cfg.dim_feedforward,
        dropout=cfg.dropout,
        activation=cfg.transformer_activation,
        enc_n_points=cfg.enc_n_points,
        dec_n_points=cfg.dec_n_points,
        two_stage_type=cfg.two_stage_type,
        embed_init_tgt=cfg.embed_init_tgt,
        dec_pred_bbox_embed_share=cfg.dec_pred_bbox_embed_share,
        dec_pred_class_embed_share=cfg.dec_pred_class_embed_share,
        two_stage_bbox_embed_share=cfg.two_stage_bbox_embed_share,
        two_stage_class_embed_share=cfg.two_stage_class_embed_share,
        aux_loss=cfg.aux_loss,
        dn_number=cfg.dn_number if cfg.use_dn else 0,
        dn_label_noise_ratio=cfg.dn_label_noise_ratio,
        dn_box_noise_scale=cfg.dn_box_noise_scale,
        dn_labelbook_size=cfg.dn_labelbook_size,
    )


def build_criterion(cfg: DINOConfig) -> SetCriterion:
    """Hungarian matcher + set criterion with the official loss names and ``weight_dict``."""
    matcher = HungarianMatcher(
        cost_class=cfg.set_cost_class,
        cost_bbox=cfg.set_cost_bbox,
        cost_giou=cfg.set_cost_giou,
        focal_alpha=cfg.focal_alpha,
    )
    weight_dict = official_weight_dict(
        cls_loss_coef=cfg.cls_loss_coef,
        bbox_loss_coef=cfg.bbox_loss_coef,
        giou_loss_coef=cfg.giou_loss_coef,
        use_dn=cfg.use_dn,
        aux_layers=cfg.dec_layers - 1 if cfg.aux_loss else 0,
        two_stage=cfg.two_stage_type != "no",
        interm_loss_coef=cfg.interm_loss_coef,
        no_interm_box_loss=cfg.no_interm_box_loss,
    )
    return SetCriterion(
        num_classes=cfg.num_classes, matcher=matcher, weight_dict=weight_dict, focal_alpha=cfg.focal_alpha
    )
