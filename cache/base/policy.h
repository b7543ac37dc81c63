/* cache: policies by path — [policy NAME] sections of the configuration,
 * their globs, and what a file that matches one gets (policy.c). */
#ifndef NVC_POLICY_H
#define NVC_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Eviction priority: clean data of a lower level goes first. */
enum pol_prio { PRIO_LOW, PRIO_NORMAL, PRIO_HIGH, PRIO_N };

/* cache.mode's values, and one more that only a policy can give. */
#define MODE_BYPASS 3

#define POL_MAX_RULES 256
#define POL_NAME_MAX 32 /* bytes of a name, its NUL included */
#define POL_MAX_PATTERNS 16 /* match keys of one rule */
#define POL_AGE_GLOBAL UINT64_MAX /* destage_after not set */

/* A compiled glob: its path components, "**" standing for any number. */
struct pol_glob {
	char *text; /* as written, for messages and printing */
	char *buf; /* the components, NUL-separated */
	char **comp;
	int ncomp;
};

/* What a file gets from the rule it matched (or from none). */
struct pol_match {
	const char *name; /* interned: valid as long as the process; NULL:
			     no rule matched */
	int mode; /* enum cache_mode or MODE_BYPASS; -1: cache.mode */
	int pin; /* the rule asks for the file's data to be pinned */
	int prio; /* enum pol_prio */
	uint64_t age_ms; /* destage_after; POL_AGE_GLOBAL: max_dirty_age */
};

struct pol_set; /* the rules of one configuration file, in order */

/* Parsing (config.c): a [policy NAME] section begins at line, then its keys.
 * 0, or -EINVAL with the reason (no FILE:LINE) in msg. */
int pol_section_begin(struct pol_set **sp, const char *name, int line,
		      char *msg, size_t len);
int pol_set_key(struct pol_set *s, const char *key, const char *value, int line,
		char *msg, size_t len);
/* After the whole file: every rule complete and consistent; on error *line
 * is the line to name. */
int pol_validate(const struct pol_set *s, int *line, char *msg, size_t len);
/* Is this INI section name a policy section ("policy" and a name)?  *name:
 * where the name begins. */
int pol_is_section(const char *section, const char **name);
void pol_set_put(struct pol_set *s);
int pol_set_equal(const struct pol_set *a, const struct pol_set *b);
int pol_count(const struct pol_set *s);
void pol_print(const struct pol_set *s, FILE *f);
void pol_help(FILE *f);
void pol_man(FILE *f);

/* The first rule that path (relative to the mount) and size match: its
 * index, or -1 with *out the global defaults. */
int pol_match(const struct pol_set *s, const char *path, uint64_t size,
	      struct pol_match *out);

/* The live rules, replaced by a reload while opens read them. */
struct pol_set *pol_live_get(struct pol_set *const *slot);
/* *slot takes *next (NULL after); the old set is put. */
void pol_live_swap(struct pol_set **slot, struct pol_set **next);

/* A glob alone (tests). */
int pol_glob_compile(const char *pat, struct pol_glob *g, char *msg,
		     size_t len);
int pol_glob_match(const struct pol_glob *g, const char *path);
void pol_glob_free(struct pol_glob *g);

/* config.c's value parsers, shared with the policy keys. */
int cfg_parse_size(const char *s, uint64_t *out);
int cfg_parse_time_ms(const char *s, uint64_t *out);

#endif
