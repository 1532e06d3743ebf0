// The whole public API of ckptio.
#pragma once

#include "ckptio/copy.h"
#include "ckptio/index.h"
#include "ckptio/local.h"
#include "ckptio/manager.h"
#include "ckptio/s3.h"
#include "ckptio/sharding.h"
#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "ckptio/types.h"
