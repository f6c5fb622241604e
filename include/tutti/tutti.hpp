// Umbrella header: the core vocabulary, the runtime and the ready-made presets.
#pragma once

#include <tutti/core/concepts.hpp>
#include <tutti/core/handles.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/runtime.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/uri.hpp>
#include <tutti/presets.hpp>
