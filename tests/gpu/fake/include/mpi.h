/* A stand-in for MPI's header (see tests/gpu/fake/include/cuda_runtime_api.h): the calls NCCL
 * over MPI makes while setting up its communicators, for one process (a world of one); the calls
 * are fakes (tests/gpu/fake/fake_gpu.c). */
#ifndef MW_TESTS_FAKE_MPI_H
#define MW_TESTS_FAKE_MPI_H

typedef int MPI_Comm;
typedef int MPI_Datatype;

#define MPI_SUCCESS 0
#define MPI_UNDEFINED (-32766)
#define MPI_COMM_WORLD ((MPI_Comm)0x44000000)
#define MPI_CHAR ((MPI_Datatype)0x4c000101)
#define MPI_BYTE ((MPI_Datatype)0x4c00010d)

int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm);
int MPI_Comm_free(MPI_Comm *comm);
int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm);
int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm);

#endif
