/* GPT-2 as a meshwit graph: the model builder shared by the gpt2 example, the bench and the tests,
 * and llm.c's model-file format for moving weights to and from existing GPT-2 tooling.
 *
 * The model (pre-LayerNorm, GELU, learned positions, output head tied to the token embedding):
 *   tokens [Batch, Seq] -> wte[Vocab, Embed] lookup + wpe[Ctx, Embed] rows 0..Seq-1
 *   L x { x += attn(ln1(x)); x += mlp(ln2(x)) } -> lnf -> logits = x . wte -> cross-entropy
 * Parameters are named as in llm.c ("wte", "wpe", then per layer "h<l>.ln1w", "h<l>.ln1b",
 * "h<l>.qkvw", "h<l>.qkvb", "h<l>.attprojw", "h<l>.attprojb", "h<l>.ln2w", "h<l>.ln2b",
 * "h<l>.fcw", "h<l>.fcb", "h<l>.fcprojw", "h<l>.fcprojb", then "lnfw", "lnfb"); a linear layer's
 * weight is [Out, In] as in PyTorch and llm.c. */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <stdint.h>

#include "meshwit.h"

typedef struct gpt2_config {
    int layers, heads, channels;
    int max_seq;      /* context length the position table holds (llm.c's maxT) */
    int vocab;        /* real vocabulary size (llm.c's V) */
    int padded_vocab; /* rows of wte (llm.c's Vp, >= vocab); logits beyond vocab are ignored */
    /* What Hugging Face's GPT2Config may set otherwise (zero: GPT-2's own, as llm.c computes it;
     * llm.c files hold only the defaults): */
    float ln_eps;          /* layer_norm_epsilon; 0 means 1e-5 */
    int gelu_exact;        /* activation_function "gelu": GELU through erf, not the tanh form */
    int attn_unscaled;     /* scale_attn_weights false: scores not divided by sqrt(head size) */
    int attn_layer_scaled; /* scale_attn_by_inverse_layer_idx: scores also divided by layer + 1 */
} gpt2_config;

/* Whether c computes GPT-2 as llm.c does (none of the fields above set otherwise). */
int gpt2_config_is_plain(const gpt2_config *c);

/* Whether a and b describe the same model (every field; a zero ln_eps equals 1e-5). */
int gpt2_config_equal(const gpt2_config *a, const gpt2_config *b);

/* Named presets: "tiny" (CPU-sized, byte vocabulary), "small" (a larger CPU model),
 * "gpt2-124m" (12 layers, 12 heads, 768 channels, context 1024, vocab 50257 padded to 50304).
 * Returns 0, or -1 for an unknown name. */
int gpt2_preset(const char *name, gpt2_config *out);

/* Checks a config (positive sizes, channels divisible by heads, padded_vocab >= vocab); on error
 * writes a message into err and returns -1. */
int gpt2_config_check(const gpt2_config *c, char *err, size_t errsize);

/* Number of parameters. */
int64_t gpt2_num_params(const gpt2_config *c);

/* What gpt2_build traces: the training model, or one decoding step with a key/value cache. */
typedef enum gpt2_mode {
    GPT2_TRAIN = 0, /* [Batch, Seq] tokens -> logits and the loss against targets */
    GPT2_DECODE = 1 /* [Batch] tokens at positions pos -> the next token's logits */
} gpt2_mode;

/* The batch a model is traced for and how the mesh splits it. Every axis is a mesh axis name or
 * NULL (not split). The parameters keep llm.c's names and element order in every layout. */
typedef struct gpt2_layout {
    gpt2_mode mode;
    int batch; /* sequences of the global batch */
    int seq;   /* GPT2_TRAIN: tokens per sequence (<= max_seq); GPT2_DECODE: unused */
    /* Data parallelism: the inputs' Batch is sharded over this axis (Batch -> Batch@X, the only
     * difference between single-device and data-parallel training). */
    const char *data_axis;
    /* Tensor parallelism: every layer's attention heads and MLP hidden units are split over this
     * axis (Head@Y in qkvw, qkvb, attprojw; Hidden@Y in fcw, fcb, fcprojw); the embeddings, layer
     * norms and output biases stay replicated. */
    const char *model_axis;
    /* FSDP (normally the data axis): every parameter of at least GPT2_FSDP_MIN_ELEMS elements is
     * split along its longest axis that model_axis does not split (Vocab of wte, Embed of qkvw,
     * ...): each device stores its rows, the ops gather them, the gradients are
     * reduce-scattered. Norms and biases stay replicated. */
    const char *fsdp_axis;
} gpt2_layout;

#ifndef GPT2_FSDP_MIN_ELEMS /* a build may set another to measure it */
#define GPT2_FSDP_MIN_ELEMS 16384
#endif

/* FSDP's split of a parameter (gpt2_layout.fsdp_axis), shared by the model builders: p with its
 * longest axis that no other mesh axis splits split over fsdp_axis when p has at least
 * GPT2_FSDP_MIN_ELEMS elements; else p as it is (norms and biases stay replicated: gathering
 * them would cost a collective each for little memory). fsdp_axis NULL: p. */
mw_tensor *gpt2_fsdp_split(mw_graph *g, mw_tensor *p, const char *fsdp_axis);

/* The tensors of a built model. */
typedef struct gpt2_graph {
    mw_tensor *tokens;  /* i32 input "tokens": [Batch, Seq]; decoding: [Batch] */
    mw_tensor *targets; /* i32 input "targets" [Batch, Seq] (NULL when decoding) */
    mw_tensor *pos;     /* decoding: i32 input "pos" [Batch], each token's position (< max_seq) */
    mw_tensor *logits;  /* [Batch(@X), Seq, Vocab]; decoding: [Batch, Vocab] of the next token */
    mw_tensor *loss;    /* mean cross-entropy over all tokens, a replicated scalar (NULL when
                           decoding) */
} gpt2_graph;

/* Traces GPT-2 into g for `layout` (see above); out gets its inputs and outputs. Returns the
 * graph's status.
 * Decoding (for inference programs; mw_infer_from_trainer reads a trainer's parameters by name):
 * each layer keeps a state "h<l>.kv" [Batch, Ctx, Part=2, Head, HeadDim] of the keys and values
 * of every position so far: a run writes this position's and attends to positions 0..pos, so
 * feeding a sequence's tokens at positions 0, 1, 2, ... gives the logits the training model
 * gives at those positions (to float tolerance). */
mw_status gpt2_build(mw_graph *g, const gpt2_config *c, const gpt2_layout *layout, gpt2_graph *out);

/* llm.c model files (fp32, version 3): a 256 x int32 header (magic 20240326, version 3, maxT, V,
 * L, NH, C, Vp) and the parameters in llm.c's order, each layer's tensors stacked over L.
 * gpt2_read_header fills *c from a file's header; gpt2_load copies a file's weights into the
 * trainer after checking the header matches c; gpt2_save writes the trainer's weights. All
 * return MW_OK or an error with a message in mw_last_error()-style text written to err:
 * MW_ERR_IO (open/read/write failure), MW_ERR_FORMAT (bad magic or version, truncated file,
 * header that disagrees with c: the message names the field and both values). With path NULL,
 * gpt2_save and gpt2_hf_save read every parameter as a save would and write nothing: the part of
 * every process but the writer when the trainer's parameters are split across processes (each
 * read then gathers from every process, a collective call). */
mw_status gpt2_read_header(const char *path, gpt2_config *c, char *err, size_t errsize);
/* gpt2_load's options; NULL: every field 0. */
typedef struct gpt2_load_options {
    /* 0: a file holding NaN or Inf is refused (MW_ERR_FORMAT naming the parameter and the index;
     * the parameters before it are already written); 1: it is loaded as it is. */
    int allow_nonfinite;
} gpt2_load_options;
mw_status gpt2_load(mw_trainer *tr, const gpt2_config *c, const char *path,
                    const gpt2_load_options *options, char *err, size_t errsize);
mw_status gpt2_save(mw_trainer *tr, const gpt2_config *c, const char *path, char *err,
                    size_t errsize);

/* Copies every parameter of the trainer into the inference program (of the same model, any
 * layout: an FSDP trainer's into a program that holds them whole). */
mw_status gpt2_copy_params(mw_trainer *tr, mw_infer *inf, const gpt2_config *c);

/* Hugging Face GPT-2 weights (gpt2_hf.c; config.json: gpt2_hf_config.c): a safetensors file in
 * the layout GPT2LMHeadModel.save_pretrained writes (tensor names with or without the
 * "transformer." prefix; Conv1D weights stored [In, Out]; no lm_head.weight, the head being tied
 * to wte) and the config.json beside it.
 * gpt2_hf_read_config fills *c from the config.json in path's folder (padded_vocab = vocab), a
 * strict JSON object whose every field is honoured or refused by name: the sizes, the
 * activation ("gelu_new"/"gelu_pytorch_tanh"/"gelu_fast": tanh, "gelu": exact), the
 * layer-norm epsilon, scale_attn_weights and scale_attn_by_inverse_layer_idx are honoured;
 * metadata, generation and initialisation settings change nothing; dropout is read and not
 * applied; an untied head, cross-attention, pruned heads, another MLP width or an unknown field
 * are refused. A key given twice takes its last value (as Python's json); sizes must be whole
 * numbers. MW_ERR_IO, MW_ERR_FORMAT (the message names the file, line and column),
 * MW_ERR_UNSUPPORTED.
 * gpt2_hf_load checks every tensor's presence and shape against c, and that the file holds no
 * tensor the model does not use (an lm_head.weight equal to wte and transformers' attention-mask
 * buffers excepted), before it copies any into the trainer (wte's padding rows become 0):
 * MW_ERR_IO, MW_ERR_FORMAT, MW_ERR_NOT_FOUND, MW_ERR_SHAPE, MW_ERR_UNSUPPORTED. gpt2_hf_save
 * writes the file with the prefix, and config.json beside it (after the weights, atomically), so
 * that transformers' GPT2LMHeadModel.from_pretrained(folder) loads it (name it
 * model.safetensors). Messages go to err. */
mw_status gpt2_hf_read_config(const char *path, gpt2_config *c, char *err, size_t errsize);
/* The same, with a note for the user in note (empty when none): the dropout probabilities it
 * read and does not apply. */
mw_status gpt2_hf_read_config_note(const char *path, gpt2_config *c, char *note, size_t notesize,
                                   char *err, size_t errsize);
/* Whether gpt2_hf_save may write path for model c: the config.json beside it is absent or
 * describes c (another model's, or a file that is not a GPT-2 config, is never replaced).
 * MW_ERR_IO with the reason in err otherwise. */
mw_status gpt2_hf_check_save(const char *path, const gpt2_config *c, char *err, size_t errsize);
mw_status gpt2_hf_load(mw_trainer *tr, const gpt2_config *c, const char *path, char *err,
                       size_t errsize);
mw_status gpt2_hf_save(mw_trainer *tr, const gpt2_config *c, const char *path, char *err,
                       size_t errsize);

/* Whether path names a safetensors file (by its extension). */
int gpt2_is_safetensors(const char *path);

/* The config.json beside path (in path's folder) into cfg; -1 when it does not fit. */
int gpt2_hf_config_path(const char *path, char *cfg, size_t n);

/* Starts writing config.json for c at cfg: *out is open (beside its final name) with the text
 * written, for the caller to sync and commit once the weights are written, or abandon. The
 * message goes to err. */
mw_status gpt2_hf_write_config(const char *cfg, const gpt2_config *c, mw_output **out, char *err,
                               size_t errsize);

#endif
