-- Argo CD health check for gpusharing.io/GPUNode (resource.customizations.health.gpusharing.io_GPUNode).
-- The controller writes the spec and the node's agent writes the status; the status says:
--   deleting                                   -> Progressing
--   no status yet, or generation not observed   -> Progressing (the agent has not acted on this spec yet)
--   Stalled True (NVML unreadable, an unhealthy GPU, a GPU that refused its sharing, a drain that timed
--   out or failed), or Ready False              -> Degraded
--   a GPU Healthy False, or a GPU Applied False with a permanent reason
--                                               -> Degraded, with or without Stalled: an agent from before
--                                                  Stalled existed writes only these, and a rolling
--                                                  upgrade of the agent shows such objects for a while
--   Reconciling True, or Applied False          -> Progressing (applying, draining, waiting for pods)
--   Applied True                                -> Healthy
-- The message is the deciding condition's message.
local hs = {}

-- The GPU Applied=False reasons that mean "cannot be done until someone acts": exactly
-- v1alpha1.HardwareRejectionReasons() in api/v1alpha1/conditions.go (test/gitops fails when they differ).
local permanent = {
  CommandFailed = true,
  DrainFailed = true,
  DrainTimedOut = true,
  InvalidSharing = true,
  LayoutDoesNotFit = true,
  MIGModeChangePending = true,
  MPSDaemonFailed = true,
  NVMLError = true,
  NotMIGCapable = true,
  SizingDoesNotFit = true,
  StrategyNeedsMIGDisabled = true,
}

local function condition(ctype)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function gpu_condition(gpu, ctype)
  if gpu.conditions == nil then
    return nil
  end
  for _, c in ipairs(gpu.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

-- stalled_gpu is the message of the first GPU that cannot converge until someone acts, as the agent's
-- Stalled condition words it: an unhealthy GPU first, then a GPU that refused its sharing.
local function stalled_gpu()
  if obj.status.gpus == nil then
    return nil
  end
  for _, g in ipairs(obj.status.gpus) do
    local h = gpu_condition(g, "Healthy")
    if h ~= nil and h.status == "False" then
      return "GPU " .. tostring(g.index) .. ": " .. tostring(h.message)
    end
  end
  for _, g in ipairs(obj.status.gpus) do
    local a = gpu_condition(g, "Applied")
    if a ~= nil and a.status == "False" and permanent[a.reason] then
      return "GPU " .. tostring(g.index) .. ": " .. tostring(a.message)
    end
  end
  return nil
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Deleting"
  return hs
end

local ready = condition("Ready")
local applied = condition("Applied")
if ready == nil or applied == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the node's gpusharing agent to report"
  return hs
end
local generation = obj.metadata and obj.metadata.generation or nil
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the agent to act on generation " .. tostring(generation)
  return hs
end

local stalled = condition("Stalled")
if is_true(stalled) then
  hs.status = "Degraded"
  hs.message = stalled.message
  return hs
end
if ready.status ~= "True" then
  hs.status = "Degraded"
  hs.message = ready.message
  return hs
end
local stalled_msg = stalled_gpu()
if stalled_msg ~= nil then
  hs.status = "Degraded"
  hs.message = stalled_msg
  return hs
end
local reconciling = condition("Reconciling")
if is_true(reconciling) then
  hs.status = "Progressing"
  hs.message = reconciling.message
  return hs
end
if applied.status ~= "True" then
  hs.status = "Progressing"
  hs.message = applied.message
  return hs
end
hs.status = "Healthy"
hs.message = applied.message
return hs
