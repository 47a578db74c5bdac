/* capstan: a job worker runtime for Sidekiq-format Redis queues. One include for
 * the whole public API: every header meson installs. */
#ifndef CAPSTAN_H
#define CAPSTAN_H

#define CAPSTAN_VERSION "0.1.0"

#include "error.h"
#include "redis.h"
#include "config.h"
#include "job.h"
#include "runtime.h"
#include "client.h"
#include "unique.h"
#include "middleware.h"
#include "limiter.h"
#include "qlock.h"
#include "batch.h"
#include "periodic.h"
#include "testing.h"

#endif
