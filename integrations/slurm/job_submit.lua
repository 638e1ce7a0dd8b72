--[[
job_submit.lua: fitcheck's memory-fit check inside slurmctld (Slurm's job_submit/lua plugin,
JobSubmitPlugins=lua in slurm.conf, this file next to slurm.conf). Install steps, the failure
policy and the measured cost: docs/gating.md, "In slurmctld". Tested against a live slurmctld
(Debian 12's Slurm 22.05.8, whose job_submit_lua.so is built against Lua 5.1) by
tests/test_slurm_live.py.

For every batch job whose script holds "#FITCHECK", the plugin sends the job (its #FITCHECK
lines and its allocation: job_desc's min_nodes, num_tasks, ntasks_per_node, sockets_per_node,
tres_per_job, tres_per_node, tres_per_socket, tres_per_task) to the check and reads back one
line, "FITCHECK <code> <message>":
  0 admitted (or not checked) -> the job is submitted
  3 rejected, 4 bad job spec  -> refused; the user sees the reason
  6, or no answer at all      -> FAIL_OPEN decides
The check reads no file: a #FITCHECK spec=, job=, model.config or GPU-profile path is refused
without being read or looked for (fitcheck-sbatch writes such files into the script).

Where the check runs:
  SOCKET   a local `fitcheck-sbatch --fitcheck-serve SOCKET` (one warm process, a fork per
           job: measured 8-14 ms an admitted job, 70 ms a rejected one), reached with
           lua-socket (Debian: lua-socket; require "socket.unix");
  COMMAND  else, when SOCKET is nil, lua-socket is missing or nothing listens there: one
           process per job, `COMMAND < request` (measured 120-270 ms an admitted job).
The plugin runs inside slurmctld's submit RPC, holding its read locks and the job_submit/lua
mutex: every millisecond here delays every other submission, and a hung check stalls them.
]]

-- Settings: the admin's -----------------------------------------------------------------------
local SOCKET = "/run/fitcheck/slurm.sock"   -- nil: never use the socket
local COMMAND = "/opt/fitcheck/venv/bin/fitcheck-sbatch --fitcheck-controller"  -- nil: none
local TIMEOUT_S = 2        -- for the socket's connect/send/receive, and the whole COMMAND
local FAIL_OPEN = true     -- no verdict (check down, timed out, crashed): admit (true) or refuse
------------------------------------------------------------------------------------------------

local PROTOCOL = "fitcheck-slurm 1"
local FIELDS = {"user_name", "name", "min_nodes", "num_tasks", "ntasks_per_node",
                "sockets_per_node", "tres_per_job", "tres_per_node", "tres_per_socket",
                "tres_per_task"}

-- slurm.log_* and log_user run string.format over their arguments: a message goes in as an
-- argument to "%s", never as the format (a '%' in a user's value would break it)
local function one_line(s, max)
    s = tostring(s or ""):gsub("[%c]+", " ")
    if #s > (max or 400) then s = s:sub(1, max or 400) .. "..." end
    return s
end

local function field(v)
    if v == nil then return "" end
    if type(v) == "number" then
        if v ~= math.floor(v) then return tostring(v) end
        return string.format("%d", v)   -- never "8.0" (Lua 5.3+) nor "8e+00"
    end
    return one_line(v, 1000)
end

local function request(job_desc, submit_uid)
    -- only the lines that can be directives: the check applies the exact rule
    local lines = {}
    for line in job_desc.script:gmatch("[^\n]*") do
        if line:find("#FITCHECK", 1, true) then table.insert(lines, line) end
    end
    local directives = table.concat(lines, "\n") .. "\n"
    local head = {PROTOCOL}
    for _, k in ipairs(FIELDS) do
        table.insert(head, k .. "=" .. field(job_desc[k]))
    end
    table.insert(head, "submit_uid=" .. field(submit_uid))
    table.insert(head, "directives_bytes=" .. #directives)
    return table.concat(head, "\n") .. "\n\n" .. directives
end

local clock = os.time   -- seconds; socket.gettime (microseconds) where lua-socket is installed
do
    local ok, socket = pcall(require, "socket")
    if ok and socket and socket.gettime then clock = socket.gettime end
end

-- (answer line, nil) or (nil, why, reached): reached is false when nothing listens there
local function ask_socket(req)
    if SOCKET == nil then return nil, "no SOCKET set", false end
    local ok, unix = pcall(require, "socket.unix")
    if not ok then return nil, "lua-socket (socket.unix) is not installed", false end
    local c = unix()
    c:settimeout(TIMEOUT_S, "t")
    local connected, err = c:connect(SOCKET)
    if not connected then
        c:close()
        return nil, "cannot connect to " .. SOCKET .. ": " .. tostring(err), false
    end
    c:settimeout(TIMEOUT_S, "t")
    local sent, serr = c:send(req)
    if not sent then
        c:close()
        return nil, "sending to " .. SOCKET .. ": " .. tostring(serr), true
    end
    c:settimeout(TIMEOUT_S, "t")
    local line, rerr = c:receive("*l")
    c:close()
    if line == nil then
        return nil, "no answer from " .. SOCKET .. " within " .. TIMEOUT_S .. " s: "
                    .. tostring(rerr), true
    end
    return line, nil, true
end

local function shell_quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- (answer line, nil) or (nil, why). Lua 5.1's p:close() returns only true, whatever the
-- exit status, so the status is echoed on the last line and read from the output.
local function ask_command(req)
    if COMMAND == nil then return nil, "no COMMAND set" end
    local path = os.tmpname()   -- mkstemp: a new file, mode 0600
    local f = io.open(path, "w")
    if f == nil then return nil, "cannot write a temporary file" end
    f:write(req)
    f:close()
    local cmd = string.format("timeout -k 1 %s %s < %s 2>&1; echo \"exit=$?\"",
                              tostring(TIMEOUT_S), COMMAND, shell_quote(path))
    local p = io.popen(cmd)
    local out = p and p:read("*a") or ""
    if p then p:close() end
    os.remove(path)
    local answer, last, status = nil, nil, out:match("exit=(%d+)%s*$")
    for line in out:gmatch("[^\n]+") do
        if answer == nil and line:match("^FITCHECK %d+ ") then answer = line end
        if not line:match("^exit=%d+$") then last = line end
    end
    if answer ~= nil then return answer, nil end
    local why = "exit " .. tostring(status)
    if status == "124" or status == "137" then
        why = why .. ", timed out after " .. TIMEOUT_S .. " s"
    end
    if last ~= nil then why = why .. ": " .. last end
    return nil, "COMMAND gave no answer (" .. why .. ")"
end

local function no_verdict(who, why, via, ms)
    why = one_line(why, 300)
    if FAIL_OPEN then
        slurm.log_info("fitcheck: %s verdict=none via=%s cost_ms=%s: %s; admitted per FAIL_OPEN",
                       who, via, ms, why)
        slurm.log_user("%s", "fitcheck: the memory check could not run (" .. why .. "); "
                       .. "submitted unchecked per the site's policy")
        return slurm.SUCCESS
    end
    slurm.log_error("fitcheck: %s verdict=none via=%s cost_ms=%s: %s; refused per FAIL_OPEN",
                    who, via, ms, why)
    slurm.log_user("%s", "fitcheck: the memory check could not run (" .. why .. "); not "
                   .. "submitted per the site's policy: try again, or ask the admins")
    return slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local script = job_desc.script
    if script == nil or not script:find("#FITCHECK", 1, true) then
        return slurm.SUCCESS   -- not ours: untouched, no cost
    end
    local t0 = clock()
    local req = request(job_desc, submit_uid)
    local via = "socket"
    local answer, why, reached = ask_socket(req)
    if answer == nil and not reached and COMMAND ~= nil then
        via = "command"
        answer, why = ask_command(req)
    end
    local ms = string.format("%.1f", (clock() - t0) * 1000)
    local who = string.format("user=%s job=%s", one_line(job_desc.user_name or submit_uid, 64),
                              one_line(job_desc.name or "?", 128))
    if answer == nil then return no_verdict(who, why, via, ms) end
    local code, message = answer:match("^FITCHECK (%d+) (.*)$")
    code = tonumber(code)
    message = one_line(message, 1000)
    if code == 0 then
        if message:find("^not checked") then return slurm.SUCCESS end
        slurm.log_info("fitcheck: %s verdict=admit via=%s cost_ms=%s: %s", who, via, ms, message)
        slurm.log_user("%s", "fitcheck: " .. message)
        return slurm.SUCCESS
    end
    if code == 3 or code == 4 then
        local verdict = code == 3 and "reject" or "bad-spec"
        slurm.log_info("fitcheck: %s verdict=%s via=%s cost_ms=%s: %s", who, verdict, via, ms,
                       message)
        slurm.log_user("%s", "fitcheck: " .. message)
        return slurm.ERROR
    end
    return no_verdict(who, message or answer, via, ms)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
