/* gpt2: the program of these sources for GPT-2 (gpt2.c runs it; examples/llama/llama.c is the
 * same program for the Llama family). */
#include "gpt2.h"

int main(int argc, char **argv) { return program_main(argc, argv, FAMILY_GPT2); }
