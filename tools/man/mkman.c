/* tools/man: build-time generator of the man pages — copies a template,
 * putting the version for @VERSION@ and the key table (cfg_man) for @KEYS@. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../../cache/cache.h"

/* One template line to out: @VERSION@ replaced, an @KEYS@ line expanded. */
static void put_line(FILE *out, const char *line)
{
	const char *at;

	if (!strcmp(line, "@KEYS@\n")) {
		cfg_man(out);
		return;
	}
	while ((at = strstr(line, "@VERSION@"))) {
		fwrite(line, 1, at - line, out);
		fputs(NVC_VERSION, out);
		line = at + strlen("@VERSION@");
	}
	fputs(line, out);
}

int main(int argc, char **argv)
{
	char line[4096];
	FILE *in, *out;

	if (argc != 3) {
		fprintf(stderr, "usage: mkman TEMPLATE OUTPUT\n");
		return 2;
	}
	in = fopen(argv[1], "r");
	if (!in) {
		fprintf(stderr, "mkman: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	out = fopen(argv[2], "w");
	if (!out) {
		fprintf(stderr, "mkman: %s: %s\n", argv[2], strerror(errno));
		fclose(in);
		return 1;
	}
	while (fgets(line, sizeof(line), in))
		put_line(out, line);
	fclose(in);
	if (fclose(out)) {
		fprintf(stderr, "mkman: %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	return 0;
}
