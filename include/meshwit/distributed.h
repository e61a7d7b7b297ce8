/* meshwit: several processes, on one host or many, through MPI.
 *
 * Launch one process per host (or per GPU) with mpirun, call mw_distributed_init first thing in
 * main, and make meshes as usual: under mpirun with more than one process, mw_mesh_new spans all
 * of them (meshwit/mesh.h). Gradients are reduced hierarchically: in shared memory among a
 * process's CPU devices, over MPI between processes, then back out in shared memory; GPUs across
 * processes use NCCL communicators set up over MPI.
 *
 *   mpirun -np 4 --host a:2,b:2 build/linreg --devices cpu:1
 *
 * In a build without MPI (MESHWIT_MPI=OFF, or no MPI found) every call below is a no-op that
 * describes a world of one process, so the same program runs unchanged.
 *
 * How gradients of CPU devices travel between processes. Each bucket is all-reduced with a
 * reduce-scatter and an all-gather on MPI point-to-point messages (MPI_Isend/MPI_Irecv, polled
 * with MPI_Testall; buffers of up to 8 KiB in one round instead). A bucket starts as soon as
 * backward has written it and is progressed between the operations of the rest of backward;
 * every bucket is complete before the optimizer update. MPI_Allreduce is not used: it blocks
 * (no timeout, no abort, no overlap), and Open MPI 4.1's MPI_Iallreduce measured 1.6-2.7x slower
 * than MPI_Allreduce at 1 MiB and 16 MiB between two processes (it reduces to one process and
 * broadcasts back when the buffer is in place or there are fewer than 4 processes).
 * `meshwit-bench mpi` measures meshwit's all-reduce beside MPI_Allreduce.
 *
 * Determinism, and against what. Every element of a reduced gradient is summed by one process,
 * in process order, and copied to the others; so:
 * - every process gets the same bits (the replicas stay identical);
 * - a run is bitwise repeatable for a fixed layout of devices over processes, whatever Open MPI's
 *   transport (shared memory, TCP), version, algorithm selection or tuning parameters;
 * - with one device per process, the sum is in rank order: bitwise the result of the same mesh
 *   in one process (cpu:N); with several devices per process, it is the sum in process order of
 *   each process's sum in rank order ((r0 + r1) + (r2 + r3)), which agrees with rank order to
 *   float rounding (a few ulp of the sum of magnitudes per element);
 * - against one device (the whole batch on cpu:1), results agree to float tolerance only: the
 *   batch is summed in shards first.
 * CUDA devices across processes use ncclAllReduce, in NCCL's order (collectives/mpi/nccl_mpi.c).
 *
 * Failures. A collective between processes waits at most mw_trainer_config.collective_timeout_ms
 * (on a mesh that spans processes, 0 means MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS, not forever) and
 * then fails the step with MW_ERR_TIMEOUT. A step that fails on a mesh spanning processes leaves
 * the trainer unusable (peers may still be inside an MPI collective that cannot be cancelled;
 * MW_ERR_NONFINITE (MW_NONFINITE_STOP) is the exception, since every process stops alike):
 * further steps return MW_ERR_STATE. The program should then report the error and call
 * mw_distributed_abort, which ends every process of the job. A process that exits with a non-zero
 * status also makes mpirun end the job. */
#ifndef MESHWIT_DISTRIBUTED_H
#define MESHWIT_DISTRIBUTED_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cross-process collective timeout used when a trainer's config gives 0: 60 s. */
#define MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS 60000

/* Initialises MPI (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) when meshwit was built with
 * MPI, the process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in
 * the environment) and MPI is not initialised yet; otherwise a no-op. argc and argv may be NULL.
 * MPI lives in the module libmeshwit-mpi.so, loaded only in a process started by a launcher: a
 * program run on its own never loads libmpi. A program that initialised MPI itself may skip this
 * call. Errors: MW_ERR_DEVICE (MPI failed to initialise, or the module or libmpi cannot be
 * loaded: the message names the file), MW_ERR_UNSUPPORTED (the module was not found),
 * MW_ERR_STATE (MPI reports another world than the launcher started: a module built for another
 * MPI; the message gives both). Call from the main thread before any other meshwit call. */
mw_status mw_distributed_init(int *argc, char ***argv);

/* Finalises MPI when mw_distributed_init initialised it; otherwise a no-op. Call after every
 * trainer and mesh is freed. */
void mw_distributed_finalize(void);

/* This process's rank and the number of processes (0 and 1 when MPI is not in use). */
int mw_distributed_rank(void);
int mw_distributed_size(void);

/* Non-zero when this build of meshwit has MPI support (makes libmeshwit-mpi.so). */
int mw_distributed_available(void);

/* Checks that every process passes the same `text` (lines separated by '\n', e.g. one
 * "--flag value" per line); collective over all processes, within timeout_ms (0:
 * MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS). Returns MW_OK when they agree (always with one process);
 * otherwise MW_ERR_INVALID on every process, with a message naming `what`, the first line that
 * differs and both ranks ("flags: rank 1: --seed 2; rank 0: --seed 1"), or MW_ERR_TIMEOUT when a
 * process does not arrive. MW_ERR_INVALID also, before anything is exchanged, for a NULL what or
 * text or a negative timeout_ms. */
mw_status mw_distributed_agree(const char *what, const char *text, int timeout_ms);

/* Ends the whole job with exit status `code`: MPI_Abort on MPI_COMM_WORLD when MPI is in use,
 * exit(code) otherwise. Does not return. The one meshwit call that ends the process: call it from
 * programs, after reporting the error, never from a library. */
void mw_distributed_abort(int code);

#ifdef __cplusplus
}
#endif
#endif
