/* tests: recovery itself — what it rewrites survives a crash during recovery
 * (issue 9, review question: rewrites while the sequence number was 0). */
#define _GNU_SOURCE
#include "env.h"

#include "../../cache/media/media.h"

static uint8_t *record(struct env *e, int k, uint32_t i)
{
	return (uint8_t *)e->mirrors[k].addr + META_HDR_SIZE +
	       (uint64_t)i * META_FILE_SIZE;
}

/*
 * Mirror 1 holds an older copy of a file record (a crash between the two
 * mirrors' writes).  Recovery rewrites it on both; a crash after it rewrote
 * mirror 0 and before mirror 1 must still let the newer copy win.
 */
static void test_recovery_rewrite_survives_crash(void)
{
	struct env e;
	char *buf = malloc(300 * KiB);
	uint8_t old[META_FILE_SIZE];
	struct cfile *f;
	uint64_t size;
	int fd;

	env_init(&e, 64, 64 * KiB);
	f = file_open(&e, "f", &fd);
	fill(buf, 300 * KiB, 1);
	CHECK_EQ(cache_write(e.c, f, buf, 100 * KiB, 0), 0);
	memcpy(old, record(&e, 1, 0), sizeof(old)); /* size 100 KiB */
	CHECK_EQ(cache_write(e.c, f, buf, 300 * KiB, 0), 0);
	cache_file_put(e.c, f);
	cache_abandon(e.c);
	close(fd);
	memcpy(record(&e, 1, 0), old, sizeof(old));
	env_open(&e); /* rewrites record 0 on both mirrors */
	cache_abandon(e.c); /* and the power goes */
	memcpy(record(&e, 1, 0), old, sizeof(old)); /* mirror 1 not reached */
	env_open(&e);
	f = file_open(&e, "f", &fd);
	{
		struct stat st;

		fstat(fd, &st);
		CHECK_EQ(cache_file_attr(e.c, st.st_dev, st.st_ino, &size,
					 NULL),
			 0);
	}
	CHECK_EQ(size, 300 * KiB);
	CHECK(same(&e, f, buf, 300 * KiB, 0));
	cache_file_put(e.c, f);
	close(fd);
	env_fini(&e);
	free(buf);
}

int main(void)
{
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_recovery_rewrite_survives_crash);
	free(rbuf);
	return CHECK_DONE();
}
