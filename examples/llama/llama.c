/* llama: trains, evaluates and samples Llama-family models (Llama 2/3, Mistral without a sliding
 * window, Qwen2: RMS norm, rotary positions, grouped-query attention, SwiGLU) over a mesh of
 * devices, with the gpt2 program's interface: the same sources (examples/gpt2), the model of
 * examples/common/llama_model.c, Hugging Face safetensors and config.json in and out. */
#include "../gpt2/gpt2.h"

int main(int argc, char **argv) { return program_main(argc, argv, FAMILY_LLAMA); }
