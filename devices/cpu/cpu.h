/* Internal: CPU-backend services the trainer uses. */
#ifndef MW__CPU_H
#define MW__CPU_H

/* Sets OpenBLAS's (process-wide) thread count; returns the previous one. */
int mw__cpu_set_blas_threads(int n);

#endif
