// Compiled once to produce the shared precompiled header (see cmake/pch.h).
