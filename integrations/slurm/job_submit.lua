--[[
job_submit.lua: a SKETCH of gating in slurmctld itself (Slurm's job_submit/lua plugin).
Untested against a live slurmctld; read docs/gating.md before using it.

fitcheck-sbatch gates jobs that users submit through it. To gate every batch job instead,
slurmctld can run the same check from the job_submit/lua plugin (JobSubmitPlugins=lua in
slurm.conf, this file next to slurm.conf). Caveats:
  * the plugin runs inside slurmctld while it holds locks: every call here delays all other
    RPCs. fitcheck answers in ~0.1 s cold, but a hung call would stall the controller, hence
    `timeout` below and the fail-open default (FAIL_OPEN = true);
  * only jobs whose script carries #FITCHECK lines are checked; others pass untouched;
  * the field names (job_desc.script, min_nodes, tres_per_node, tres_per_job) are those of
    Slurm 23.x/24.x; check `job_desc` of your version.
]]

local FITCHECK_SBATCH = "/opt/fitcheck/integrations/slurm/fitcheck-sbatch"
local TIMEOUT_S = 5
local FAIL_OPEN = true   -- the check could not run: admit (true) or reject (false)

local function shell_quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local script = job_desc.script
    if script == nil or not script:find("#FITCHECK", 1, true) then
        return slurm.SUCCESS
    end
    local path = os.tmpname()
    local f = io.open(path, "w")
    if f == nil then
        return FAIL_OPEN and slurm.SUCCESS or slurm.ERROR
    end
    f:write(script)
    f:close()

    -- the allocation as the controller sees it (overrides the script's #SBATCH lines)
    local args = {}
    if job_desc.min_nodes ~= nil and job_desc.min_nodes ~= slurm.NO_VAL then
        table.insert(args, "--nodes=" .. job_desc.min_nodes)
    end
    if job_desc.tres_per_node ~= nil then          -- e.g. "gres/gpu:8" or "gres/gpu:h100:8"
        table.insert(args, "--gres=" .. job_desc.tres_per_node)
    end
    if job_desc.tres_per_job ~= nil then           -- e.g. "gres/gpu:16"
        local n = job_desc.tres_per_job:match("gpu[:%w]*:(%d+)")
        if n ~= nil then table.insert(args, "--gpus=" .. n) end
    end
    local quoted = {}
    for _, a in ipairs(args) do table.insert(quoted, shell_quote(a)) end

    -- dry run: gate only, submit nothing; exit 0 admit, 3 reject, 4 bad spec
    local cmd = string.format("timeout %d %s --fitcheck-dry-run --sbatch /bin/true %s %s 2>&1",
                              TIMEOUT_S, shell_quote(FITCHECK_SBATCH),
                              table.concat(quoted, " "), shell_quote(path))
    local p = io.popen(cmd)
    local out = p:read("*a")
    local ok, how, code = p:close()
    os.remove(path)

    if ok then
        return slurm.SUCCESS
    end
    if how == "exit" and (code == 3 or code == 4) then
        local reason = out:match("fitcheck%-sbatch: rejected: ([^\n]*)")
                    or out:match("fitcheck%-sbatch: error: ([^\n]*)") or "rejected"
        slurm.log_user("fitcheck: " .. reason)
        return slurm.ERROR
    end
    slurm.log_info("fitcheck: check failed (%s %s): %s", tostring(how), tostring(code), out)
    return FAIL_OPEN and slurm.SUCCESS or slurm.ERROR
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
