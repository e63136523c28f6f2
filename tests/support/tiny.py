"""The tiny preset the session fixtures export (model_export.config.PRESETS["tiny"])."""

MODEL = "tiny"
D_MODEL = 32
N_HEADS = 4
N_LAYERS = 2
D_FF = 64
MODEL_MAX_SEQ_LEN = 128
