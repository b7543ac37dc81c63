/* tests: a tiny assertion helper for the unit test programs. */
#ifndef NVC_CHECK_H
#define NVC_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_failures;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #cond);                              \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_EQ(a, b)                                                    \
	do {                                                              \
		long long _a = (long long)(a), _b = (long long)(b);       \
		if (_a != _b) {                                           \
			fprintf(stderr,                                   \
				"%s:%d: CHECK failed: %s == %s (%lld != " \
				"%lld)\n",                                \
				__FILE__, __LINE__, #a, #b, _a, _b);      \
			check_failures++;                                 \
		}                                                         \
	} while (0)

#define RUN(fn)                                                                \
	do {                                                                   \
		int _before = check_failures;                                  \
		fn();                                                          \
		printf("%s %s\n", check_failures == _before ? "ok  " : "FAIL", \
		       #fn);                                                   \
	} while (0)

#define CHECK_DONE()                                                         \
	(check_failures                                                      \
		 ? (fprintf(stderr, "%d check(s) failed\n", check_failures), \
		    1)                                                       \
		 : 0)

#endif
