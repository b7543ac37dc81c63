/* tests/fuzz: runs a fuzz target on files and directories of inputs without
 * libFuzzer (the corpus and every crash found, as unit tests in any build). */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "r");
	uint8_t *buf;
	long n;

	if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET)) {
		perror(path);
		return 1;
	}
	buf = malloc(n ? n : 1);
	if (!buf || fread(buf, 1, n, f) != (size_t)n) {
		perror(path);
		return 1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	int i, ran = 0, bad = 0;

	for (i = 1; i < argc; i++) {
		struct stat st;
		struct dirent **names;
		int n, k;

		if (stat(argv[i], &st))
			continue; /* no crash found yet: no directory */
		if (!S_ISDIR(st.st_mode)) {
			bad += run_file(argv[i]);
			ran++;
			continue;
		}
		n = scandir(argv[i], &names, NULL, alphasort);
		for (k = 0; k < n; k++) {
			char path[4096];

			if (names[k]->d_name[0] != '.') {
				snprintf(path, sizeof(path), "%s/%s", argv[i],
					 names[k]->d_name);
				bad += run_file(path);
				ran++;
			}
			free(names[k]);
		}
		free(names);
	}
	printf("%d inputs replayed\n", ran);
	return bad || !ran;
}
