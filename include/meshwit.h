/* meshwit: data-parallel training of named-axis tensor graphs across devices.
 *
 * The umbrella header. See meshwit/graph.h (tracing models), meshwit/mesh.h (devices and meshes),
 * meshwit/trainer.h (compiling and running steps), meshwit/infer.h (forward-only programs for
 * prediction), meshwit/sample.h (drawing tokens from logits as Hugging Face's generate does) and
 * meshwit/weights.h (listing parameters, safetensors weight files), meshwit/pipeline.h (a model's
 * layers in stages along a mesh axis, micro-batches flowing between them); every fallible call
 * returns an mw_status (meshwit/status.h); meshwit/distributed.h runs meshes across processes
 * through MPI; meshwit/tokenizer.h turns text into GPT-2's token ids and back, as Hugging Face
 * tokenizers does; meshwit/file.h is the discipline every file a program reads or writes goes
 * through (inputs that never block, outputs checked before the work and replaced only whole). */
#ifndef MESHWIT_H
#define MESHWIT_H

#define MESHWIT_VERSION_MAJOR 0
#define MESHWIT_VERSION_MINOR 1
#define MESHWIT_VERSION_PATCH 0

#include "meshwit/distributed.h"
#include "meshwit/file.h"
#include "meshwit/graph.h"
#include "meshwit/infer.h"
#include "meshwit/mesh.h"
#include "meshwit/pipeline.h"
#include "meshwit/sample.h"
#include "meshwit/status.h"
#include "meshwit/tokenizer.h"
#include "meshwit/trainer.h"
#include "meshwit/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0" */
const char *mw_version(void);

#ifdef __cplusplus
}
#endif
#endif
