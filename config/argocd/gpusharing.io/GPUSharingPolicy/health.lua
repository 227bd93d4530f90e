-- Argo CD health check for gpusharing.io/GPUSharingPolicy (resource.customizations.health.gpusharing.io_GPUSharingPolicy).
-- It reads only the policy's own status, which the gpusharing controller recomputes on every pass:
--   deleting                                  -> Progressing (the finalizer restores the default sharing)
--   status not written for this generation    -> Progressing
--   Stalled/Degraded True (hardware refused a GPU, a drain timed out or failed, an unhealthy GPU) -> Degraded
--   Conflicted True (equal priority overlap)  -> Degraded (fix the priorities in Git)
--   Ready False NoMatchingGPUs                -> Suspended (nothing selected yet; nothing to do)
--   Reconciling/Progressing True, Ready False -> Progressing
--   Ready True                                -> Healthy
-- The message is the deciding condition's message.
local hs = {}

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

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  local ready = condition("Ready")
  hs.status = "Progressing"
  if ready ~= nil and ready.reason == "RestoringDefault" then
    hs.message = ready.message
  else
    hs.message = "Deleting: waiting for the GPUs to return to the default sharing"
  end
  return hs
end

local generation = obj.metadata and obj.metadata.generation or nil
local observed = obj.status and obj.status.observedGeneration or nil
if condition("Ready") == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpusharing controller to report status"
  return hs
end
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpusharing controller to observe generation " .. tostring(generation)
  return hs
end

local stalled = condition("Stalled")
local degraded = condition("Degraded")
if is_true(stalled) then
  hs.status = "Degraded"
  hs.message = stalled.message
  return hs
end
if is_true(degraded) then
  hs.status = "Degraded"
  hs.message = degraded.message
  return hs
end
local conflicted = condition("Conflicted")
if is_true(conflicted) then
  hs.status = "Degraded"
  hs.message = conflicted.message
  return hs
end

local ready = condition("Ready")
if ready.status ~= "True" and ready.reason == "NoMatchingGPUs" then
  hs.status = "Suspended"
  hs.message = ready.message
  return hs
end
local reconciling = condition("Reconciling") or condition("Progressing")
if is_true(reconciling) then
  hs.status = "Progressing"
  hs.message = reconciling.message
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Progressing"
end
hs.message = ready.message
return hs
