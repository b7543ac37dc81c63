/* tests: the lock rules are asserted (core/core.h): a _locked function called without c->lock, a blocking call made with it, and a device-life command entered with a file's lock held each abort a debug build. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../cache/mngt/mngt.h"
#include "env.h"

static struct env e;
static struct cfile *tf;

enum { BREAK_NONE, BREAK_UNLOCKED, BREAK_BLOCKING, BREAK_DEVLIFE };

/* In the child: c->lock as its own; 0 if another thread held it when the
 * process forked (it is never given back here). */
static int child_lock(void)
{
	int i;

	for (i = 0; i < 100; i++) {
		if (!pthread_mutex_trylock(&e.c->lock))
			return 1;
		usleep(1000);
	}
	return 0;
}

static void child(int how)
{
	char err[256];

	switch (how) {
	case BREAK_NONE: /* the same calls, the rules kept */
		if (!child_lock())
			_exit(3);
		freeq_wait_locked(e.c);
		pthread_mutex_unlock(&e.c->lock);
		backing_sync(e.c, tf, 1);
		break;
	case BREAK_UNLOCKED:
		freeq_wait_locked(e.c); /* without c->lock */
		break;
	case BREAK_BLOCKING:
		if (!child_lock())
			_exit(3);
		backing_sync(e.c, tf, 1); /* an fdatasync under c->lock */
		break;
	case BREAK_DEVLIFE:
		frw_rdlock(tf);
		cache_detach(e.c, NULL, NULL, err, sizeof(err));
		break;
	}
	_exit(0);
}

/* How a child that makes the calls of how ends: its wait status. */
static int run(int how)
{
	int tries, status = 0;

	for (tries = 0; tries < 20; tries++) {
		pid_t pid = fork();

		if (pid < 0)
			return -1;
		if (!pid) {
			/* an abort's core and message are expected */
			signal(SIGABRT, SIG_DFL);
			child(how);
		}
		if (waitpid(pid, &status, 0) != pid)
			return -1;
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 3)
			break; /* 3: c->lock was another thread's at the fork */
	}
	return status;
}

static void test_rules_asserted(void)
{
	int fd, st;

	env_format(&e, 16, 64 * KiB, NULL);
	env_open(&e);
	CHECK(e.c->shared); /* past recovery: the rules hold */
	tf = file_open(&e, "a", &fd);
	CHECK(tf != NULL);

	st = run(BREAK_NONE);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	st = run(BREAK_UNLOCKED);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
	st = run(BREAK_BLOCKING);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
	st = run(BREAK_DEVLIFE);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);

	cache_file_put(e.c, tf);
	close(fd);
	env_fini(&e);
}

int main(void)
{
#ifdef NDEBUG
	printf("test_lockrules: an NDEBUG build asserts nothing\n");
	return 77;
#endif
	log_setup(LOG_TO_STDERR);
	rbuf = dev_alloc_buf(2 * MiB + 8192);
	RUN(test_rules_asserted);
	free(rbuf);
	return CHECK_DONE();
}
