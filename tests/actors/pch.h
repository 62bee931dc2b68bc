// Precompiled for actors_test: Asio, spdlog and GoogleTest are most of its compile time.
#pragma once
#include <boost/asio.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include "actors/strand_actor.h"
