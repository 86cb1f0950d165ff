"""Names of the GGUF metadata keys the converter writes.

The llama.cpp names (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md and llama.cpp's
llama-arch.cpp) plus this project's additions for Markov heads no runtime supports yet. `{arch}`
is replaced by the architecture name (e.g. `qwen3`, `dflash`).
"""
from __future__ import annotations

# general
ARCHITECTURE = "general.architecture"
TYPE = "general.type"
NAME = "general.name"
SIZE_LABEL = "general.size_label"
FILE_TYPE = "general.file_type"
QUANTIZATION_VERSION = "general.quantization_version"

# hyperparameters shared by every decoder
VOCAB_SIZE = "{arch}.vocab_size"
CONTEXT_LENGTH = "{arch}.context_length"
EMBEDDING_LENGTH = "{arch}.embedding_length"
BLOCK_COUNT = "{arch}.block_count"
FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
HEAD_COUNT = "{arch}.attention.head_count"
HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
KEY_LENGTH = "{arch}.attention.key_length"
VALUE_LENGTH = "{arch}.attention.value_length"
RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
CAUSAL = "{arch}.attention.causal"
VALUE_SCALE = "{arch}.attention.value_scale"
SLIDING_WINDOW = "{arch}.attention.sliding_window"
SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"
ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
ROPE_FREQ_BASE = "{arch}.rope.freq_base"
ROPE_SCALING_TYPE = "{arch}.rope.scaling.type"
ROPE_SCALING_FACTOR = "{arch}.rope.scaling.factor"
ROPE_SCALING_ORIG_CTX = "{arch}.rope.scaling.original_context_length"
ROPE_YARN_EXT_FACTOR = "{arch}.rope.scaling.yarn_ext_factor"
ROPE_YARN_ATTN_FACTOR = "{arch}.rope.scaling.yarn_attn_factor"
ROPE_YARN_BETA_FAST = "{arch}.rope.scaling.yarn_beta_fast"
ROPE_YARN_BETA_SLOW = "{arch}.rope.scaling.yarn_beta_slow"
LOGIT_SCALE = "{arch}.logit_scale"
FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
EMBEDDING_SCALE = "{arch}.embedding_scale"
HIDDEN_ACTIVATION = "{arch}.hidden_activation"
ATTENTION_SCALE = "{arch}.attention.scale"

# interleaved sliding-window models (Gemma-4): the *_SWA keys describe the sliding layers
KEY_LENGTH_SWA = "{arch}.attention.key_length_swa"
VALUE_LENGTH_SWA = "{arch}.attention.value_length_swa"
ROPE_FREQ_BASE_SWA = "{arch}.rope.freq_base_swa"
ROPE_DIMENSION_COUNT_SWA = "{arch}.rope.dimension_count_swa"
SHARED_KV_LAYERS = "{arch}.attention.shared_kv_layers"
EMBEDDING_LENGTH_PER_LAYER_INPUT = "{arch}.embedding_length_per_layer_input"

# mixture of experts
EXPERT_COUNT = "{arch}.expert_count"
EXPERT_USED_COUNT = "{arch}.expert_used_count"
EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
EXPERT_SHARED_FEED_FORWARD_LENGTH = "{arch}.expert_shared_feed_forward_length"

# DFlash / DSpark drafts (llama.cpp)
BLOCK_SIZE = "{arch}.block_size"
TARGET_LAYERS = "{arch}.target_layers"
SAMPLE_FROM_ANCHOR = "{arch}.sample_from_anchor"
HAS_CONFIDENCE_HEAD = "{arch}.has_confidence_head"
# DSpark drafts (this project): "vanilla" | "gated" | "rnn"
MARKOV_HEAD_TYPE = "{arch}.markov_head_type"
# The confidence head's temperature per predicting slot, from DSpark's sequential temperature
# scaling (this project): confidence_j = sigmoid(logit_j / T_j)
CONFIDENCE_TEMPERATURES = "{arch}.confidence_temperatures"

# tokenizer
TOKENIZER_MODEL = "tokenizer.ggml.model"
TOKENIZER_PRE = "tokenizer.ggml.pre"
TOKENS = "tokenizer.ggml.tokens"
TOKEN_TYPES = "tokenizer.ggml.token_type"
TOKEN_SCORES = "tokenizer.ggml.scores"
MERGES = "tokenizer.ggml.merges"
ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"
CHAT_TEMPLATE = "tokenizer.chat_template"
CHAT_TEMPLATE_NAMED = "tokenizer.chat_template.{name}"
CHAT_TEMPLATE_NAMES = "tokenizer.chat_templates"
MASK_TOKEN_ID = "tokenizer.ggml.mask_token_id"

# special token ids and "add this token" flags, by Hugging Face role name
SPECIAL_TOKEN_ID = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic: the spelling llama.cpp reads
    "pad": "tokenizer.ggml.padding_token_id",
    "cls": "tokenizer.ggml.cls_token_id",
    "mask": MASK_TOKEN_ID,
}
ADD_SPECIAL_TOKEN = {
    "bos": "tokenizer.ggml.add_bos_token",
    "eos": "tokenizer.ggml.add_eos_token",
    "sep": "tokenizer.ggml.add_sep_token",
}
