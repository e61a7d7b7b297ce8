/* Llama-family models (Llama 2/3, Mistral without sliding window, Qwen2) as a meshwit graph: the
 * model builder of the llama example, the bench and the tests, beside gpt2_model.h and sharing its
 * layout and graph types.
 *
 * The model (pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, no biases but
 * Qwen2's on q, k and v, the output head tied to the token embedding or its own):
 *   tokens [Batch, Seq] -> embed[Vocab, Embed] lookup
 *   L x { x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)) } -> rmsnorm -> logits -> cross-entropy
 * Parameters ("embed", per layer "l<l>.attn_norm", "l<l>.qkv", "l<l>.qkv_bias" (Qwen2),
 * "l<l>.o", "l<l>.mlp_norm", "l<l>.gate_up", "l<l>.down", then "norm" and, untied, "lm_head"):
 *   qkv     [KvHead, Part = G + 2, HeadDim, Embed]: each key/value head's G query heads, its key
 *           and its value (q_proj's rows of query head h = kv head h / G, group h % G; k_proj's
 *           and v_proj's of kv head j), so one contraction makes mw_attention_grouped's operand
 *   o       [Out, KvHead, Group, HeadDim]: o_proj's weight in its own order
 *   gate_up [Part = 2, Hidden, Embed]: gate_proj's then up_proj's weight (mw_swiglu's operand)
 *   down    [Out, Hidden]
 * Tensor parallelism splits KvHead (whole groups per device) and Hidden; FSDP splits what is
 * large, as GPT-2's does. */
#ifndef LLAMA_MODEL_H
#define LLAMA_MODEL_H

#include <stdint.h>

#include "gpt2_model.h"
#include "meshwit.h"

typedef enum llama_family {
    LLAMA_FAMILY_LLAMA = 0, /* model_type "llama" */
    LLAMA_FAMILY_MISTRAL,   /* "mistral" (no sliding window) */
    LLAMA_FAMILY_QWEN2      /* "qwen2": biases on q, k and v */
} llama_family;

typedef struct llama_config {
    llama_family family;
    int layers, heads, kv_heads, channels, head_dim, hidden; /* hidden: the MLP's width */
    int max_seq;                                             /* max_position_embeddings */
    int vocab;                                               /* vocab_size */
    float rms_eps;                                           /* rms_norm_eps */
    int tied;            /* tie_word_embeddings: the head is the token embedding */
    int qkv_bias;        /* attention_bias (Llama) or Qwen2's q, k, v biases */
    mw_rope_config rope; /* rope_theta, rope_scaling (llama3) */
    /* What a Hugging Face config.json carried that changes no computation but is written back
     * (bos/eos token ids: -1 when absent). */
    int bos_id, eos_id;
} llama_config;

/* Named presets: "tiny" (CPU-sized, byte vocabulary: L4 C128 H4 KV2, MLP 352) and "small" (llm.c's
 * GPT-2 size, the bench's llama case: L4 C256 H4 KV2, MLP 688 ~ 8C/3, context 256). Returns 0, or
 * -1 for an unknown name. */
int llama_preset(const char *name, llama_config *out);

/* Checks a config (positive sizes, heads divisible by kv_heads, rope parameters); on error writes
 * a message into err and returns -1. */
int llama_config_check(const llama_config *c, char *err, size_t errsize);

/* Whether a and b describe the same model. */
int llama_config_equal(const llama_config *a, const llama_config *b);

int64_t llama_num_params(const llama_config *c);

/* Traces the model into g for `layout` (gpt2_model.h's: the mode, batch, sequence and the mesh
 * axes of data, tensor and FSDP parallelism); out gets its inputs and outputs. Decoding keeps a
 * state "l<l>.kv" [Batch, Ctx, Part=2, KvHead, HeadDim] per layer, as GPT-2's. */
mw_status llama_build(mw_graph *g, const llama_config *c, const gpt2_layout *layout,
                      gpt2_graph *out);

/* Copies every parameter of the trainer into the inference program (of the same model). */
mw_status llama_copy_params(mw_trainer *tr, mw_infer *inf, const llama_config *c);

/* Hugging Face weights (llama_hf.c): model.safetensors as LlamaForCausalLM,
 * MistralForCausalLM or Qwen2ForCausalLM save_pretrained writes it, and the config.json beside
 * it, whose every field is honoured or refused by name (llama_hf_read_config); llama_hf_load
 * checks every tensor's presence and shape (and that the file holds none the model does not use)
 * before it copies any; llama_hf_save writes both so that from_pretrained loads them. Messages go
 * to err. */
mw_status llama_hf_read_config(const char *path, llama_config *c, char *err, size_t errsize);
mw_status llama_hf_load(mw_trainer *tr, const llama_config *c, const char *path, char *err,
                        size_t errsize);
mw_status llama_hf_save(mw_trainer *tr, const llama_config *c, const char *path, char *err,
                        size_t errsize);
/* Whether llama_hf_save may write path for model c: the config.json beside it is absent or
 * describes c. MW_ERR_IO with the reason in err otherwise. */
mw_status llama_hf_check_save(const char *path, const llama_config *c, char *err, size_t errsize);

#endif
