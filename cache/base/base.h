/* cache/base: what every layer of the cache may use: the interface's types, configuration, policies, logging, statistics counters, slot locks. */
#ifndef NVC_BASE_H
#define NVC_BASE_H

#include "../cache.h"
#include "policy.h"
#include "srw.h"
#include "stats.h"

#endif
