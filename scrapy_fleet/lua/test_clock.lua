-- test_clock.lua: TEST ONLY, never in a production script.  lua/sources.py puts it right after
-- common.lua while a test has the test clock on (sources.set_test_clock, tests/conftest.py
-- ``lua_clock``): every step that reads server_now_ms() then sees Redis TIME plus the integer
-- number of ms stored at the key @KEY@ (keys.TEST_CLOCK_KEY; absent: 0), which the test
-- advances instead of sleeping.  Off (the default), the scripts are the files as they are.
-- Keys: @KEY@ (read; not declared in KEYS: a single server only).  Writes: nothing.
local server_now_ms_real = server_now_ms
local function server_now_ms()
  return server_now_ms_real() + (tonumber(redis.call('GET', '@KEY@')) or 0)
end
