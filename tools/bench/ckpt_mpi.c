/* tools/bench/ckpt_mpi.c: an HPC checkpoint with MPI-IO — every rank writes its block of one shared file at disjoint offsets through its node's path, then syncs and closes. */
/*
 * Usage: mpirun -np N ckpt_mpi PER_NODE SIZES_KIB PATH_NODE1 [PATH_NODE2 ...]
 *
 * Rank r is on node r / PER_NODE and opens that node's path (one file, seen
 * through each node's mount).  SIZES_KIB is a comma-separated list of the
 * ranks' block sizes in KiB (multiples of 4), cycled over the ranks; rank r
 * writes at the sum of the blocks before it.  Each 4 KiB block at file
 * offset o of rank r holds (r, o) as two little-endian 64-bit words, then
 * the byte (31 r + o / 4096) mod 256 (tools/bench/suite.py checks this).
 * Rank 0 prints one JSON line, each the slowest rank's seconds: open_s, the
 * collective open; then, from a barrier once every rank has the file open,
 * write_s to its write returning and ack_s to MPI_File_sync returning (every
 * write and the fsync done); close_s, the close after the sync.
 * Give the paths as "ufs:PATH": ROMIO then does not statfs them before rank
 * 0 creates the file (another node may cache that the name is absent).
 * Built by suite.py with mpicc (Debian's mpich) when it is installed.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLK 4096

static long size_of(const char *list, int rank)
{
	long v[256];
	int n = 0;
	const char *p = list;

	while (*p && n < 256) {
		v[n++] = strtol(p, (char **)&p, 10) * 1024;
		if (*p == ',')
			p++;
	}
	return n ? v[rank % n] : 0;
}

static void fill(char *buf, long size, int rank, long off)
{
	long b;

	for (b = 0; b < size; b += BLK) {
		uint64_t h[2] = { (uint64_t)rank, (uint64_t)(off + b) };

		memcpy(buf + b, h, sizeof(h));
		memset(buf + b + sizeof(h), (31 * rank + (off + b) / BLK) & 0xff,
		       BLK - sizeof(h));
	}
}

int main(int argc, char **argv)
{
	int rank, nprocs, per_node, node, i;
	double t0, t[4], worst[4];
	long size, off = 0;
	MPI_File fh;
	MPI_Status st;
	char *buf;
	int count;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
	if (argc < 4) {
		if (!rank)
			fprintf(stderr, "usage: ckpt_mpi PER_NODE SIZES_KIB "
					"PATH_NODE1 [PATH_NODE2 ...]\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	per_node = atoi(argv[1]);
	node = rank / (per_node > 0 ? per_node : 1);
	if (node >= argc - 3) {
		fprintf(stderr, "rank %d: no path for node %d\n", rank, node + 1);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	size = size_of(argv[2], rank);
	for (i = 0; i < rank; i++)
		off += size_of(argv[2], i);
	if (size <= 0 || size % BLK || !(buf = malloc(size))) {
		fprintf(stderr, "rank %d: bad block size %ld\n", rank, size);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	fill(buf, size, rank, off);
	MPI_File_set_errhandler(MPI_FILE_NULL, MPI_ERRORS_ARE_FATAL);
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	MPI_File_open(MPI_COMM_WORLD, argv[3 + node],
		      MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
	t[0] = MPI_Wtime() - t0;
	/* the checkpoint proper starts when every rank has the file open */
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	MPI_File_write_at(fh, off, buf, (int)size, MPI_BYTE, &st);
	MPI_Get_count(&st, MPI_BYTE, &count);
	if (count != size) {
		fprintf(stderr, "rank %d: wrote %d of %ld bytes\n", rank, count,
			size);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	t[1] = MPI_Wtime() - t0;
	MPI_File_sync(fh);
	t[2] = MPI_Wtime() - t0;
	MPI_File_close(&fh);
	t[3] = MPI_Wtime() - t0 - t[2];
	MPI_Reduce(t, worst, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	MPI_Reduce(&size, &off, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	if (!rank)
		printf("{\"open_s\": %.6f, \"write_s\": %.6f, \"ack_s\": %.6f, "
		       "\"close_s\": %.6f, \"bytes\": %ld, \"procs\": %d}\n",
		       worst[0], worst[1], worst[2], worst[3], off, nprocs);
	free(buf);
	MPI_Finalize();
	return 0;
}
